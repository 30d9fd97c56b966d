"""The learning figures: quarter statistics of a trainer's history, chance, the warm start's traces."""

from __future__ import annotations

import json

import pytest

from embodied_r.evaluation.learning import learning_figures, reward_curves
from embodied_r.scoring.metrics import chance_accuracy, chance_levels
from embodied_r.training.learning import quarter_stats, reward_series
from embodied_r.training.warmstart import WarmstartConfig, frames, think_text, trace, traces
from embodied_r.scoring.rewards import format_reward, accuracy_reward


def _history(values: list[float]) -> list[dict]:
    steps = [{"step": i + 1, "reward": v, "rewards/accuracy_reward/mean": v / 2, "loss": 0.1}
             for i, v in enumerate(values)]
    return steps + [{"step": len(values), "train_runtime": 3.0, "train_loss": 0.1}]


def test_quarters_compare_first_and_last_quarter_of_steps():
    stats = quarter_stats(_history([0.0, 0.2, 0.2, 0.4, 0.6, 0.6, 0.8, 1.0]), ["accuracy_reward"])
    assert stats["reward"]["first"] == pytest.approx(0.1)  # steps 1-2
    assert stats["reward"]["last"] == pytest.approx(0.9)  # steps 7-8
    assert stats["reward"]["steps"] == 8
    assert stats["accuracy_reward"]["change"] == pytest.approx(0.4)


def test_quarters_round_up_and_skip_unscored_steps():
    history = _history([1.0, 0.0, 0.0, 0.0, 0.5])
    history[1]["reward"] = float("nan")  # a step whose reward was left unscored
    stats = quarter_stats(history, [])
    assert stats["reward"]["steps"] == 4  # 1.0, 0.0, 0.0, 0.5
    assert stats["reward"]["first"] == 1.0 and stats["reward"]["last"] == 0.5


def test_quarters_of_a_reward_never_logged_are_none():
    stats = quarter_stats(_history([0.5, 0.5]), ["consistency_reward"])
    assert stats["consistency_reward"] == {"first": None, "last": None, "steps": 0.0, "change": None}
    with pytest.raises(ValueError):
        quarter_stats([], [], fraction=0.7)


def test_reward_series_orders_by_step():
    assert reward_series(_history([0.3, 0.4]), [])["reward"] == [(1, 0.3), (2, 0.4)]


def test_reward_curves_put_stages_on_one_axis(tmp_path):
    folders = {}
    for stage, values in (("train_stage1", [0.1, 0.2]), ("train_stage2", [0.3, 0.4, 0.5])):
        folder = tmp_path / stage
        folder.mkdir()
        (folder / "history.json").write_text(json.dumps(
            {"reward_funcs": ["accuracy_reward"], "history": _history(values)}))
        folders[stage] = str(folder)
    curves, starts = reward_curves(folders)
    assert [s for s, _ in curves["reward"]] == [1, 2, 3, 4, 5]
    assert starts == [("train_stage1", 0), ("train_stage2", 2)]


def test_chance_counts_options_and_numbers_zero():
    records = [{"category": "a", "answer_type": "choice", "options": ["A. x", "B. y"]},
               {"category": "a", "answer_type": "choice", "options": ["A. x", "B. y", "C. z", "D. w"]},
               {"category": "n", "answer_type": "number", "options": []}]
    assert chance_accuracy(records) == pytest.approx((0.5 + 0.25) / 3)
    # Per task, numeric tasks have no chance level: the report leaves their cell empty.
    assert chance_levels(records) == {"a": pytest.approx(0.375)}
    assert chance_accuracy([]) == 0.0
    figures = learning_figures({"untrained": 0.0, "trained": 0.5}, 0.25,
                               {"stage2": {"accuracy_reward": {"first": 0.2, "last": 0.6}}})
    assert figures["learning/accuracy/trained"] == 0.5
    assert figures["learning/stage2/accuracy_reward/last_quarter"] == 0.6


RECORD = {
    "uid": "u1", "split": "train", "answer_type": "choice", "solution": "B", "system": "S",
    "question": "Which of the following objects do you see during the flight?\nOptions:\nA. A red cube.\nB. A blue cylinder.",
    "prompt": ("Video content:\n<\npreamble\nFrame 0: Observe: a street, a blue cylinder ahead.\n"
               "Frame 1: After move forward, Observe: a tree.\nFrame 2: After rotate left, Observe: sky.\n>\n"
               "Question: ..."),
}


def test_trace_walks_the_frames_and_ends_on_the_gold_answer():
    assert frames(RECORD["prompt"])[1] == (1, "move forward", "a tree.")
    think = think_text(RECORD)
    assert think.startswith("I move forward, then rotate left.")
    assert "blue" in think and "cylinder" in think and "red" not in think
    text = trace(RECORD)
    assert format_reward([text]) == [1.0]
    assert accuracy_reward([text], solution=["B"]) == [1.0]


def test_traces_are_for_the_train_split_only():
    rows = traces([RECORD], WarmstartConfig())
    assert [r["uid"] for r in rows] == ["u1", "u1#reference"]
    assert rows[1]["target"] == "B" and think_text(RECORD) in rows[1]["prompt"]
    with pytest.raises(ValueError, match="train split only"):
        traces([{**RECORD, "split": "test"}], WarmstartConfig())
