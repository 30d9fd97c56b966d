"""The demo learns (the ``demo-learning`` recipe): warm start and three GRPO stages at the
demo's fixed seed reach the issue's targets on the test split. Not timed; it fails when a reward is broken.

Accuracy here is recomputed from each prediction's letter and the gold letter, not taken
from the scorer the rewards share: a broken comparison in that scorer would otherwise
grade its own training as a success.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embodied_r.config import load_recipe
from embodied_r.pipeline import execute, plan

# The demo's learning targets (issue 13) are not met yet and a run takes well over ten
# minutes on two cores: these run only when asked for.
LEARNING = pytest.mark.skipif(not os.environ.get("EMBODIED_R_LEARNING_TESTS"),
                              reason="the demo-learning targets are not met yet (issue 13); "
                                     "set EMBODIED_R_LEARNING_TESTS=1 to run")
pytestmark = [pytest.mark.slow, LEARNING]


def _accuracy(folder: str) -> float:
    rows = pq.read_table(Path(folder) / "predictions.parquet").to_pylist()
    right = [r["prediction"].strip().upper() == r["solution"].strip().upper()
             for r in rows if r["answer_type"] == "choice"]
    numbers = [r["score"] for r in rows if r["answer_type"] == "number"]
    return (sum(right) + sum(numbers)) / len(rows)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every stage of the demo recipe, in this process, without Prefect or MLflow."""
    root = tmp_path_factory.mktemp("learning")
    stages = plan(load_recipe("demo"), root)
    summaries = {name: execute(sp) for name, sp in stages.items()}
    return {"stages": stages, "summaries": summaries}


def test_grpo_beats_the_untrained_policy_and_chance(demo_run):
    stages, final = demo_run["stages"], demo_run["summaries"]["evaluate"]
    untrained = _accuracy(stages["evaluate_untrained"].out)
    trained = _accuracy(stages["evaluate"].out)
    chance = final["learning/accuracy/chance"]
    assert trained >= untrained + 0.15, (untrained, trained)
    assert trained > chance, (trained, chance)


def test_stage2_raises_the_accuracy_reward(demo_run):
    quarters = demo_run["summaries"]["train_stage2"]["quarters"]["accuracy_reward"]
    assert quarters["last"] > quarters["first"], quarters


def test_warm_start_makes_the_format_reward_vary_from_the_first_step(demo_run):
    history = json.loads((Path(demo_run["stages"]["train_stage1"].out) / "history.json").read_text())["history"]
    first = next(e for e in history if "rewards/format_reward/mean" in e)
    assert first["rewards/format_reward/mean"] > 0
    assert (Path(demo_run["stages"]["evaluate"].out) / "reward_curves.png").is_file()
