"""The demo learns: its warm start and three GRPO stages, at the demo's fixed seed, on the
demo's synthetic benchmark. Not timed; it fails when a reward is broken.

The reasoner's run (``reasoner_run``, part of ``make test``) keeps the demo's training and
evaluation as they are and takes its perception text from the untrained tiny VLM; the
reasoner then learns from the questions, the options and the answer format alone. The whole
demo, with its own perceiver, is checked against the chance level too when
``EMBODIED_R_LEARNING_TESTS=1``.

Accuracy here is recomputed from each prediction and the gold answer, not taken from the
scorer the rewards share: a broken comparison in that scorer would otherwise grade its own
training as a success.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embodied_r.config import load_recipe
from embodied_r.pipeline import execute, plan

pytestmark = pytest.mark.slow
WHOLE_DEMO = pytest.mark.skipif(not os.environ.get("EMBODIED_R_LEARNING_TESTS"),
                                reason="the whole demo (minutes); set EMBODIED_R_LEARNING_TESTS=1")
# The untrained tiny VLM, with the short replies the smoke recipe asks of it.
UNTRAINED_PERCEPTION = {"perception": {"max_new_tokens": 16, "backend": {"model": "tiny:vlm"}}}


def _accuracy(folder: str) -> float:
    rows = pq.read_table(Path(folder) / "predictions.parquet").to_pylist()
    right = [r["prediction"].strip().upper() == r["solution"].strip().upper()
             for r in rows if r["answer_type"] == "choice"]
    numbers = [r["score"] for r in rows if r["answer_type"] == "number"]
    return (sum(right) + sum(numbers)) / len(rows)


def _run(root: Path, overrides: dict | None = None) -> dict:
    """Every stage of the demo recipe, in this process, without Prefect or MLflow."""
    stages = plan(load_recipe("demo", overrides), root)
    summaries = {name: execute(sp) for name, sp in stages.items()}
    return {"stages": stages, "summaries": summaries}


@pytest.fixture(scope="module")
def reasoner_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(tmp_path_factory.mktemp("reasoner"), UNTRAINED_PERCEPTION)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(tmp_path_factory.mktemp("demo"))


def _quarters(run: dict, stage: str, reward: str) -> dict:
    return run["summaries"][stage]["quarters"][reward]


def test_grpo_beats_the_untrained_policy_by_15_points(reasoner_run):
    stages = reasoner_run["stages"]
    untrained = _accuracy(stages["evaluate_untrained"].out)
    trained = _accuracy(stages["evaluate"].out)
    assert trained >= untrained + 0.15, (untrained, trained)


def test_each_stage_raises_the_reward_it_weights_most(reasoner_run):
    format1 = _quarters(reasoner_run, "train_stage1", "format_reward")
    accuracy2 = _quarters(reasoner_run, "train_stage2", "accuracy_reward")
    total3 = _quarters(reasoner_run, "train_stage3", "reward")
    assert format1["last"] > format1["first"], format1
    assert accuracy2["last"] > accuracy2["first"], accuracy2
    assert total3["last"] > total3["first"], total3


def test_warm_start_makes_the_format_reward_vary_from_the_first_step(reasoner_run):
    history = json.loads((Path(reasoner_run["stages"]["train_stage1"].out) / "history.json").read_text())["history"]
    first = next(e for e in history if "rewards/format_reward/mean" in e)
    assert 0 < first["rewards/format_reward/mean"] < 1
    assert (Path(reasoner_run["stages"]["evaluate"].out) / "reward_curves.png").is_file()


@WHOLE_DEMO
def test_the_whole_demo_beats_the_untrained_policy_and_chance(demo_run):
    stages, final = demo_run["stages"], demo_run["summaries"]["evaluate"]
    untrained = _accuracy(stages["evaluate_untrained"].out)
    trained = _accuracy(stages["evaluate"].out)
    assert trained >= untrained + 0.15, (untrained, trained)
    assert trained > final["learning/accuracy/chance"], (trained, final["learning/accuracy/chance"])
    accuracy2 = _quarters(demo_run, "train_stage2", "accuracy_reward")
    assert accuracy2["last"] > accuracy2["first"], accuracy2
