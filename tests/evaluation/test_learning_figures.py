"""The learning figures: quarter statistics of a trainer's history, chance, the warm start's traces."""

from __future__ import annotations

import json

import pytest

from embodied_r.evaluation.learning import (
    accuracy_lines,
    learning_figures,
    learning_verdict,
    render_learning,
    reward_curves,
    verdict_of,
)
from embodied_r.scoring.metrics import chance_accuracy, chance_levels
from embodied_r.training.learning import quarter_stats, reward_series
from embodied_r.training.warmstart import frames, think_text, trace, traces
from embodied_r.training.config import WarmstartConfig
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


def test_the_verdict_claims_learning_only_above_chance_and_the_start():
    below_chance = learning_verdict(0.045, 0.221, 0.30)
    assert below_chance == ("The GRPO-trained reasoner scores 4.5 %, below chance (22.1 %) and below the "
                            "warm-started policy (30.0 %): no learning shown at this seed.")
    below_start = learning_verdict(0.25, 0.221, 0.30)
    assert "below the warm-started policy (30.0 %): no gain from GRPO shown" in below_start
    assert "chance" not in below_start
    tie = learning_verdict(0.30, 0.221, 0.30)
    assert "no higher than the warm-started policy (30.0 %)" in tie and "learned" not in tie
    # Above both, but the interval reaches down to the warm start: not enough to say.
    unsure = learning_verdict(0.35, 0.221, 0.30, trained_low=0.28)
    assert "above chance (22.1 %) and the warm-started policy (30.0 %)" in unsure
    assert "too few questions" in unsure and "the method learned" not in unsure
    learned = learning_verdict(0.45, 0.221, 0.30, trained_low=0.375)
    assert learned.endswith("above chance (22.1 %) and the warm-started policy (30.0 %): the method learned "
                            "at this seed.")
    # Without a starting policy's figure, chance is the only bar.
    assert learning_verdict(0.40, 0.25).endswith("above chance (25.0 %): the method learned at this seed.")
    for verdict in (below_chance, below_start, tie, unsure):
        assert "the method learned" not in verdict


def test_the_figures_carry_intervals_and_the_verdict_into_console_and_report():
    figures = learning_figures({"untrained": 0.0, "warmstart": 0.30, "trained": 0.20}, 0.221, {},
                               {"untrained": (0.0, 0.08), "warmstart": (0.2, 0.4), "trained": (0.12, 0.31),
                                "chance": (0.15, 0.29)})
    assert figures["learning/accuracy/trained_ci_low"] == 0.12
    assert accuracy_lines(figures) == [("untrained", "0.0 % [0.0, 8.0]"), ("warm-started", "30.0 % [20.0, 40.0]"),
                                       ("GRPO-trained", "20.0 % [12.0, 31.0]"),
                                       ("chance", "22.1 % (a guesser lands in [15.0, 29.0])")]
    assert "below chance (22.1 %) and below the warm-started policy (30.0 %)" in verdict_of(figures)
    md = render_learning(figures, [], has_curves=False)
    assert "| GRPO-trained | 20.0 % [12.0, 31.0] |" in md and verdict_of(figures) in md
    # A recipe without a warm start: the untrained policy is where GRPO started.
    no_warm = learning_figures({"untrained": 0.10, "trained": 0.50}, 0.25, {}, {"trained": (0.4, 0.6)})
    assert verdict_of(no_warm).endswith("above chance (25.0 %) and the untrained policy (10.0 %): "
                                        "the method learned at this seed.")
    assert verdict_of({"learning/accuracy/chance": 0.25}) is None


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


def test_response_length_is_kept_per_quarter_printed_in_tokens_and_charted_apart(tmp_path, capsys):
    from embodied_r.apps.cli import _print_learning
    from embodied_r.evaluation.learning import curve_metric, reward_curves

    history = [{"step": i + 1, "reward": 0.5, "completions/mean_length": length}
               for i, length in enumerate([80.0, 70.0, 50.0, 40.0])]
    stats = quarter_stats(history, [])
    assert (stats["response_length"]["first"], stats["response_length"]["last"]) == (80.0, 40.0)
    figures = learning_figures({"untrained": 0.0, "trained": 0.5}, 0.25, {"stage1": stats})
    assert figures["learning/stage1/response_length/first_quarter"] == 80.0
    _print_learning(figures)
    printed = capsys.readouterr().out
    assert "response length, first -> last quarter: 80 -> 40 tokens" in printed
    assert "response_length" not in printed.split("mean reward")[1].split("\n")[0]  # not a reward
    folder = tmp_path / "train_stage1"
    folder.mkdir()
    (folder / "history.json").write_text(json.dumps({"history": history, "reward_funcs": []}))
    curves, _ = reward_curves({"train_stage1": str(folder)})
    assert [v for _, v in curves["response_length"]] == [80.0, 70.0, 50.0, 40.0]
    assert curve_metric("response_length") == "train/completions/mean_length"


def _stage3(acc: tuple[float, float], cons: tuple[float, float]) -> dict[str, float]:
    return {"learning/stage3/accuracy_reward/first_quarter": acc[0], "learning/stage3/accuracy_reward/last_quarter": acc[1],
            "learning/stage3/consistency_reward/first_quarter": cons[0],
            "learning/stage3/consistency_reward/last_quarter": cons[1]}


def test_failure_signatures_are_named_with_their_advice_when_planted(capsys):
    from embodied_r.apps.cli import _print_learning
    from embodied_r.evaluation.learning import failure_signatures, learning_table

    base = {"learning/accuracy/trained": 0.6, "learning/accuracy/chance": 0.25}
    # Healthy: 90 % of right answers consistent, both rising.
    assert failure_signatures({**base, **_stage3((0.50, 0.55), (0.45, 0.50)), "consistency/ratio": 0.93}) == []
    # Planted: the judge reaches few answers from their reasoning (reward hacking).
    hacked = failure_signatures({**base, "consistency/ratio": 0.62})
    assert hacked == ["Failure signature, evaluation: the judge reaches 62.0 % of the answers from their reasoning, "
                      "under 80.0 %: raise the consistency reward's weight or inspect the cases (reward hacking)."]
    # Planted: accuracy rises while the consistent share of right answers falls (memorising).
    memorising = failure_signatures({**base, **_stage3((0.50, 0.60), (0.45, 0.48))})
    assert len(memorising) == 1 and "stage3: the accuracy reward rose (50.0 % -> 60.0 %)" in memorising[0]
    assert "fell (90.0 % -> 80.0 %): strengthen the process reward (memorising)." in memorising[0]
    # Both, when the share also ends under the floor.
    both = failure_signatures({**base, **_stage3((0.50, 0.60), (0.45, 0.30))})
    assert [line.split(": ")[1].split(" ")[1] for line in both] == ["reference", "accuracy"]
    # Stages without a consistency reward say nothing about it.
    assert failure_signatures({**base, "learning/stage1/accuracy_reward/first_quarter": 0.2,
                               "learning/stage1/accuracy_reward/last_quarter": 0.6}) == []
    _print_learning({**base, **_stage3((0.50, 0.60), (0.45, 0.48))})
    assert memorising[0] in capsys.readouterr().out
    assert f"- {memorising[0]}" in learning_table({**base, **_stage3((0.50, 0.60), (0.45, 0.48))})
