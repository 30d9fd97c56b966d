"""Scoring and aggregation, against VSI-Bench's official mean relative accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from embodied_r.metrics import aggregate, category_table, mean_relative_accuracy, score_answer


def _official_mra(pred: float, target: float) -> float:
    # thinking-in-space's scorer, for positive ground truths where it is well defined.
    num_pts = (0.95 - 0.5) / 0.05 + 2
    conf_intervs = np.linspace(0.5, 0.95, int(num_pts))
    return float((abs(pred - target) / target <= 1 - conf_intervs).mean())


@pytest.mark.parametrize(
    ("pred", "truth"),
    [(3.0, 3.0), (3.1, 3.0), (3.3, 3.0), (4.0, 3.0), (1.0, 3.0), (6.0, 3.0), (0.0, 2.5),
     (2.625, 2.5), (2.75, 2.5), (100.0, 1.0), (1.5, 1.0), (0.5, 1.0)],
)
def test_mra_matches_the_official_scorer(pred: float, truth: float) -> None:
    assert mean_relative_accuracy(pred, truth) == pytest.approx(_official_mra(pred, truth))


def test_mra_edge_cases() -> None:
    assert mean_relative_accuracy(3.0, 3.0) == 1.0
    assert mean_relative_accuracy(1.6, 1.0) == 0.0  # 60 % off misses even the loosest threshold
    assert mean_relative_accuracy(1.5, 1.0) == pytest.approx(0.1)  # exactly on the loosest one
    assert mean_relative_accuracy("3.0 meters", "3") == 1.0
    assert mean_relative_accuracy("not a number", 3.0) == 0.0
    assert mean_relative_accuracy(None, 3.0) == 0.0
    assert mean_relative_accuracy(float("nan"), 3.0) == 0.0
    assert mean_relative_accuracy(float("inf"), 3.0) == 0.0
    assert mean_relative_accuracy(0.0, 0.0) == 1.0
    assert mean_relative_accuracy(0.1, 0.0) == 0.0
    # Compared by magnitude: the official ratio was negative and met every threshold.
    assert mean_relative_accuracy(-2.0, -2.0) == 1.0
    assert mean_relative_accuracy(5.0, -2.0) == 0.0
    with pytest.raises(ValueError):
        mean_relative_accuracy(1.0, "n/a")


def test_score_answer_choice_reads_only_the_answer_block() -> None:
    good = "<think>B looks wrong, answer A is tempting</think><answer>C</answer>"
    assert score_answer(good, "C", "choice") == ("C", 1.0)
    assert score_answer(good, "B", "choice") == ("C", 0.0)
    assert score_answer("<think>C</think> the answer is C", "C", "choice") == ("", 0.0)
    assert score_answer("<answer>A or C</answer>", "C", "choice") == ("", 0.0)
    assert score_answer("<answer>E</answer>", "E", "choice", n_options=4) == ("", 0.0)


def test_score_answer_number() -> None:
    assert score_answer("<answer>3.0 m</answer>", "3", "number") == ("3", 1.0)
    pred, score = score_answer("<answer>2.5</answer>", "3.0", "number")
    assert pred == "2.5" and score == pytest.approx(_official_mra(2.5, 3.0))
    assert score_answer("<answer>far</answer>", "3", "number") == ("", 0.0)
    with pytest.raises(ValueError):
        score_answer("<answer>A</answer>", "A", "free_text")


def test_aggregate_micro_and_macro() -> None:
    rows = [
        {"benchmark": "urbanvideo", "category": "Landmark Position", "score": 1.0, "prediction": "A",
         "completion": "xx", "completion_tokens": 10},
        {"benchmark": "urbanvideo", "category": "Landmark Position", "score": 1.0, "prediction": "B",
         "completion": "xxxx", "completion_tokens": 20},
        {"benchmark": "urbanvideo", "category": "Landmark Position", "score": 0.0, "prediction": "",
         "completion": "", "completion_tokens": 30},
        {"benchmark": "vsibench", "category": "route_planning", "score": 0.0, "prediction": "C",
         "completion": "x", "completion_tokens": 40},
    ]
    m = aggregate(rows)
    assert m["accuracy/overall"] == pytest.approx(0.5)
    assert m["accuracy/macro"] == pytest.approx((2 / 3 + 0.0) / 2)
    assert m["accuracy/landmark_position"] == pytest.approx(2 / 3)
    assert m["accuracy/route_planning"] == 0.0
    assert m["count/landmark_position"] == 3.0
    assert m["count/overall"] == 4.0
    assert m["accuracy_by_benchmark/urbanvideo"] == pytest.approx(2 / 3)
    assert m["accuracy_by_benchmark/vsibench"] == 0.0
    assert m["parsed/overall"] == pytest.approx(0.75)
    assert m["response_tokens/mean"] == pytest.approx(25.0)
    assert m["response_chars/max"] == 4.0
    assert all(isinstance(v, float) for v in m.values())
    table = category_table(rows)
    assert [(r["category"], r["count"]) for r in table] == [("Landmark Position", 3), ("route_planning", 1)]


def test_aggregate_of_nothing() -> None:
    assert aggregate([]) == {"count/overall": 0.0}
