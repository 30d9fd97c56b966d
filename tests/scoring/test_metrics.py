"""Scoring and aggregation, against VSI-Bench's official mean relative accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from embodied_r.scoring.metrics import (
    accuracy_interval,
    aggregate,
    category_table,
    chance_interval,
    chance_metrics,
    format_accuracy,
    mean_of_means_interval,
    mean_relative_accuracy,
    parse_official_number,
    score_answer,
    subtask_of,
    summary_interval,
)


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
    assert mean_relative_accuracy(1.5, 0.0) == 0.0  # no division by zero
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


@pytest.mark.parametrize(
    ("pred", "truth", "expected"),
    [
        # Worked by hand: a relative error e meets every threshold t with e <= 1 - t.
        (1.05, 1.0, 1.0),  # 5 % off: meets all ten, 0.95 included
        (0.95, 1.0, 1.0),
        (105.0, 100.0, 1.0),
        (1.1, 1.0, 0.9),  # 10 %: 0.50 .. 0.90 (nine)
        (0.9, 1.0, 0.9),
        (1.15, 1.0, 0.8),
        (1.2, 1.0, 0.7),
        (1.25, 1.0, 0.6),
        (1.3, 1.0, 0.5),  # 30 %: 0.50 .. 0.70
        (1.5, 1.0, 0.1),  # 50 %: on the loosest threshold only
        (0.5, 1.0, 0.1),
        (1.500001, 1.0, 0.0),
        (-1.0, 1.0, 0.0),  # 200 % off
        # Floating point, as the official scorer computes it: 1 - 0.8 is 0.19999999999999996,
        # so an error of exactly 0.2 misses 0.80 while 1.2 vs 1.0 (0.19999999999999996) meets it.
        (12.0, 10.0, 0.6),
    ],
)
def test_mra_hand_worked(pred: float, truth: float, expected: float) -> None:
    assert mean_relative_accuracy(pred, truth) == pytest.approx(expected)
    assert mean_relative_accuracy(pred, truth) == pytest.approx(_official_mra(pred, truth))


def test_mra_reads_strings_as_the_official_scorer() -> None:
    # The official scorer keeps the text up to the first space, drops trailing dots and
    # calls float(); whatever fails scores its worst case, 0.
    assert mean_relative_accuracy("3.5 meters", "3.5") == 1.0
    assert mean_relative_accuracy("3.", "3") == 1.0
    assert mean_relative_accuracy("3.0\n", "3") == 1.0
    assert mean_relative_accuracy("1e1", "10") == 1.0
    assert mean_relative_accuracy("3m", "3") == 0.0
    assert mean_relative_accuracy("about 3", "3") == 0.0
    assert mean_relative_accuracy("three", "3") == 0.0
    assert mean_relative_accuracy(" 3", "3") == 0.0  # an empty first token
    assert mean_relative_accuracy("3,5", "3.5") == 0.0
    assert mean_relative_accuracy("nan", "3") == 0.0
    assert parse_official_number("4.") == 4.0 and parse_official_number("-2 m") == -2.0
    assert parse_official_number("inf") is None and parse_official_number(True) is None
    # The ground truth is read the same way, spaces around it aside.
    assert mean_relative_accuracy(2.0, " 2.0 ") == 1.0


def test_score_answer_number_parsing_modes() -> None:
    hedged = "<think>x</think><answer>about 3 m</answer>"
    assert score_answer(hedged, "3", "number") == ("3", 1.0)  # lenient: the rewards' reading
    assert score_answer(hedged, "3", "number", number_parsing="official") == ("", 0.0)
    assert score_answer("<answer>3 m</answer>", "3", "number", number_parsing="official") == ("3", 1.0)
    assert score_answer("<answer>3.3</answer>", "3", "number", number_parsing="official")[1] == pytest.approx(0.9)
    with pytest.raises(ValueError, match="number_parsing"):
        score_answer("<answer>3</answer>", "3", "number", number_parsing="strict")  # type: ignore[arg-type]


def test_relative_direction_subtypes_from_option_count() -> None:
    assert subtask_of("object_rel_direction", ["A. left", "B. right"]) == "easy"
    assert subtask_of("object_rel_direction", ["A. left", "B. right", "C. back"]) == "medium"
    assert subtask_of("object_rel_direction", ["A. front-left", "B. front-right", "C. back-left",
                                               "D. back-right"]) == "hard"
    assert subtask_of("object_rel_direction", []) is None
    assert subtask_of("route_planning", ["A. x", "B. y"]) is None


def test_relative_direction_is_pooled_and_its_subtype_mean_reported_apart() -> None:
    def row(sub: str | None, score: float, cat: str = "object_rel_direction") -> dict:
        return {"benchmark": "vsibench", "category": cat, "subtask": sub, "score": score, "prediction": "A"}

    rows = [row("easy", 1.0), row("easy", 1.0), row("medium", 0.0), row("hard", 1.0), row("hard", 0.0),
            row("hard", 0.0), row(None, 0.5, "object_counting"),
            {"benchmark": "urbanvideo", "category": "Landmark Position", "score": 1.0, "prediction": "B"}]
    m = aggregate(rows)
    # The paper (the official code merges the subtypes): every question once, 3/6.
    assert m["accuracy/object_rel_direction"] == pytest.approx(3 / 6)
    # VSI-Bench's rule: (easy 1 + medium 0 + hard 1/3) / 3.
    assert m["accuracy/object_rel_direction/subtype_mean"] == pytest.approx(4 / 9)
    assert m["accuracy/object_rel_direction/easy"] == 1.0
    assert m["accuracy/object_rel_direction/hard"] == pytest.approx(1 / 3)
    assert m["count/object_rel_direction"] == 6.0 and m["count/object_rel_direction/hard"] == 3.0
    assert m["accuracy/overall"] == pytest.approx(4.5 / 8)  # every question once
    # The macro figures are VSI-Bench's: they take the subtype mean.
    assert m["accuracy/macro"] == pytest.approx((4 / 9 + 0.5 + 1.0) / 3)
    assert m["macro_by_benchmark/vsibench"] == pytest.approx((4 / 9 + 0.5) / 2)  # VSI-Bench's "overall"
    assert m["accuracy_by_benchmark/vsibench"] == pytest.approx(3.5 / 7)
    # The paper's avg: every question of its eight tasks once (counting is not one of them).
    assert m["accuracy/paper_tasks"] == pytest.approx(4 / 7) and m["count/paper_tasks"] == 7.0
    table = {r["category"]: r for r in category_table(rows)}
    assert table["object_rel_direction"]["accuracy"] == pytest.approx(3 / 6)
    assert table["object_rel_direction"]["subtype_mean"] == pytest.approx(4 / 9)
    assert "subtype_mean" not in table["Landmark Position"]
    assert table["object_rel_direction"]["subtasks"]["medium"] == {"count": 1, "accuracy": 0.0}
    assert "subtasks" not in table["Landmark Position"]


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
    assert m["response_tokens/median"] == pytest.approx(25.0) and m["response_tokens/p90"] == 40.0
    assert m["response_chars/max"] == 4.0
    assert all(isinstance(v, float) for v in m.values())
    table = category_table(rows)
    assert [(r["category"], r["count"]) for r in table] == [("Landmark Position", 3), ("route_planning", 1)]


def test_aggregate_of_nothing() -> None:
    assert aggregate([]) == {"count/overall": 0.0}


# -- 95 % intervals ------------------------------------------------------------------------


@pytest.mark.parametrize(("right", "n", "low", "high"), [
    (0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0), (81, 100, 0.7222, 0.8749),
    (68, 150, 0.3758, 0.5332),
])
def test_accuracy_interval_is_wilsons(right: int, n: int, low: float, high: float) -> None:
    # Wilson score intervals at z = 1.96, as published (e.g. 0 of 10: [0, 0.2775]).
    assert accuracy_interval(right, n) == pytest.approx((low, high), abs=1e-4)


def test_accuracy_interval_of_fractional_scores_and_of_nothing() -> None:
    # Numeric answers' fractional scores are summed: 10 questions at 0.5 read as 5 of 10.
    assert accuracy_interval(10 * 0.5, 10) == accuracy_interval(5, 10)
    assert accuracy_interval(0, 0) == (0.0, 1.0)
    assert format_accuracy(68 / 150, accuracy_interval(68, 150)) == "45.3 % [37.6, 53.3]"
    assert format_accuracy(0.25) == "25.0 %"


def test_mean_of_means_interval() -> None:
    # Two groups, one all wrong and one all right: centred on the mean, and wide.
    low, high = mean_of_means_interval([(0.5, 0.0, 10), (0.5, 10.0, 10)])
    assert (low + high) / 2 == pytest.approx(0.5) and high - low == pytest.approx(0.2576, abs=1e-4)
    # One group of 50 comes out close to Wilson's interval.
    assert mean_of_means_interval([(1.0, 15.0, 50)]) == pytest.approx(accuracy_interval(15, 50), abs=0.02)
    assert mean_of_means_interval([]) == (0.0, 1.0)


def test_aggregate_writes_the_headline_intervals() -> None:
    rows = [{"benchmark": "urbanvideo", "category": "Landmark Position", "score": float(i < 5)} for i in range(10)]
    m = aggregate(rows)
    assert (m["accuracy/overall_ci_low"], m["accuracy/overall_ci_high"]) == accuracy_interval(5, 10)
    assert (m["accuracy/paper_tasks_ci_low"], m["accuracy/paper_tasks_ci_high"]) == accuracy_interval(5, 10)
    assert m["accuracy/macro_ci_low"] < 0.5 < m["accuracy/macro_ci_high"]
    assert summary_interval(m, "accuracy/overall") == accuracy_interval(5, 10)
    # Without written bounds, Wilson's from the question count; a mean of means has none.
    assert summary_interval({"accuracy/x": 0.5, "count/x": 10.0}, "accuracy/x") == accuracy_interval(5, 10)
    assert summary_interval({"accuracy/x/subtype_mean": 0.5}, "accuracy/x/subtype_mean") is None


def test_chance_of_every_metric_and_a_guessers_range() -> None:
    records = [{"benchmark": "vsibench", "category": "object_rel_direction", "answer_type": "choice",
                "options": ["A. l", "B. r"]},
               {"benchmark": "vsibench", "category": "object_rel_direction", "answer_type": "choice",
                "options": ["A. l", "B. r", "C. b", "D. f"]},
               {"benchmark": "vsibench", "category": "object_counting", "answer_type": "number", "options": []}]
    chance = chance_metrics(records)
    assert chance["accuracy/overall"] == pytest.approx(0.75 / 3)
    assert chance["accuracy/object_rel_direction"] == pytest.approx(0.375)
    assert chance["accuracy/macro"] == pytest.approx(0.375 / 2)  # counting's chance is 0
    assert not any(k.endswith(("_ci_low", "_ci_high")) for k in chance)
    # 100 four-option questions: a guesser lands within 1.96 * sqrt(100 * 3/16) / 100 of 25 %.
    assert chance_interval([0.25] * 100) == pytest.approx((0.25 - 0.08487, 0.25 + 0.08487), abs=1e-4)
    assert chance_interval([0.0, 0.0]) == (0.0, 0.0)


# -- found by mutation testing (make mutation) -------------------------------------------


@pytest.mark.parametrize("text, value", [
    ("3.. m", 3.0),  # trailing dots go, as the official scorer strips them
    (".5.", 0.5),  # only trailing ones
    ("3X", None),  # anything else left on the token fails float()
    ("2.5m", None),
])
def test_official_number_strips_trailing_dots_only(text: str, value: float | None) -> None:
    from embodied_r.scoring.metrics import parse_official_number

    assert parse_official_number(text) == value


def test_mra_names_a_bad_ground_truth() -> None:
    with pytest.raises(ValueError, match="ground truth 'x' is not a finite number"):
        mean_relative_accuracy(1.0, "x")


def test_slugs() -> None:
    from embodied_r.scoring.metrics import category_slug, slug

    assert slug("  Landmark Position! ") == "landmark_position"
    assert slug("__a--b__") == "a_b" and slug("X-ray X") == "x_ray_x"
    assert slug("") == "unknown" and slug("!!!") == "unknown"
    assert category_slug("Overall") == "category_overall" and category_slug("paper tasks") == "category_paper_tasks"
    assert category_slug("Landmark Position") == "landmark_position"


def test_length_statistics_of_the_responses() -> None:
    from embodied_r.scoring.metrics import aggregate

    rows = [{"benchmark": "urbanvideo", "category": "Counterfactual", "score": 1.0,
             "completion_tokens": t, "completion": "x" * t} for t in (7, 3, 10, 1, 5, 2, 9, 4, 8, 6)]
    out = aggregate(rows)
    for prefix in ("response_tokens", "response_chars"):
        assert (out[f"{prefix}/min"], out[f"{prefix}/max"], out[f"{prefix}/p90"]) == (1.0, 10.0, 9.0)
        assert (out[f"{prefix}/mean"], out[f"{prefix}/median"]) == (5.5, 5.5)
    one = aggregate([{**rows[0], "completion_tokens": 4, "completion": "abcd"}])
    assert one["response_tokens/p90"] == one["response_tokens/min"] == 4.0


def test_rows_without_a_benchmark_or_category() -> None:
    from embodied_r.scoring.metrics import aggregate, category_table

    rows = [{"score": 1.0}, {"score": 0.0, "category": "Counterfactual"}]
    assert aggregate(rows)["accuracy_by_benchmark/unknown"] == 0.5
    assert category_table(rows) == [
        {"benchmark": "", "category": "", "count": 1, "score_sum": 1.0, "accuracy": 1.0},
        {"benchmark": "", "category": "Counterfactual", "count": 1, "score_sum": 0.0, "accuracy": 0.0},
    ]
