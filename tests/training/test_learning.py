"""Training that trains: a warm-started tiny policy whose GRPO stage moves its weights and
raises its reward, a learning rate of 0 that moves nothing, and a trainer killed for real
(SIGKILL to its process group) whose rerun ends where an uninterrupted run ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from embodied_r.backends.base import BackendConfig
from embodied_r.io import partial_path
from embodied_r.training.config import GRPOStageConfig, SFTConfig, TrainingConfig
from tests.stage_inputs import build_records, catalog_row
from tests.killing import kill_at_item

pytestmark = pytest.mark.slow

STAGE = GRPOStageConfig(name="s", rewards={"format": 0.5, "accuracy": 0.5})


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [catalog_row(f"urbanvideo:{i}", "train", answer="ABCD"[i % 4]) for i in range(8)]
    return build_records(tmp_path_factory.mktemp("learning_records"), rows)


def sft_cfg(**kw: Any) -> SFTConfig:
    base: dict[str, Any] = dict(use_cpu=True, gradient_checkpointing=False, learning_rate=3e-3, warmup_ratio=0.0,
                                per_device_train_batch_size=4, gradient_accumulation_steps=1, max_steps=16,
                                max_length=1024, save_steps=1000, think="ok")
    base.update(kw)
    return SFTConfig(**base)


@pytest.fixture(scope="module")
def warm_policy(records: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny LM after a short SFT on the records' gold ``<think>ok</think><answer>X</answer>``:
    it writes the format often enough for GRPO's rewards to differ within a group."""
    from embodied_r.training.sft import run_sft

    out = tmp_path_factory.mktemp("warm") / "sft"
    run_sft(records, "tiny:lm", out, sft_cfg())
    return out / "model"


def grpo_cfg(**kw: Any) -> TrainingConfig:
    base: dict[str, Any] = dict(
        policy="tiny:lm", reference=BackendConfig(model="tiny:lm", device="cpu", max_new_tokens=4),
        num_generations=4, per_device_train_batch_size=8, gradient_accumulation_steps=1,
        max_completion_length=24, max_steps_per_stage=8, use_cpu=True, gradient_checkpointing=False,
        learning_rate=1e-3, warmup_ratio=0.0, save_steps=1000, stages=[STAGE], completion_table_rows=0,
        logging_steps=1,
    )
    base.update(kw)
    return TrainingConfig(**base)


def weights(model: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model / "model.safetensors"))


def changed(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not (a[k] == b[k]).all()]


def step_rewards(work: Path, step: int) -> list[float]:
    """The trainer's own reward (weighted sum, mean over the step's completions) per step,
    from the last checkpoint's log history."""
    import json

    state = json.loads((work / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return [entry["reward"] for entry in state["log_history"] if "reward" in entry]


def test_a_grpo_stage_moves_the_weights_and_raises_the_reward(records: Path, warm_policy: Path,
                                                              tmp_path: Path) -> None:
    from embodied_r.training.stage import run_training_stage

    out = tmp_path / "grpo"
    summary = run_training_stage(records, str(warm_policy), out, STAGE,
                                 grpo_cfg(keep_checkpoints=True, save_steps=8))
    assert summary["steps"] == 8
    moved = changed(weights(warm_policy), weights(out / "model"))
    assert len(moved) >= len(weights(warm_policy)) // 2, moved
    # The rewards the trainer saw (seeded sampling): higher over the last half of the stage.
    rewards = step_rewards(out, 8)
    assert len(rewards) == 8
    assert sum(rewards[4:]) > sum(rewards[:4]), rewards


def test_learning_rate_zero_changes_nothing(records: Path, warm_policy: Path, tmp_path: Path) -> None:
    """The control: everything as above but the step size, and not one weight moves."""
    from embodied_r.training.stage import run_training_stage

    summary = run_training_stage(records, str(warm_policy), tmp_path / "grpo", STAGE,
                                 grpo_cfg(learning_rate=0.0, allow_zero_learning_rate=True, max_steps_per_stage=2))
    assert summary["steps"] == 2
    assert changed(weights(warm_policy), weights(tmp_path / "grpo" / "model")) == []


# -- a real SIGKILL, then a rerun ---------------------------------------------------------


def test_killed_training_resumes_to_the_uninterrupted_result(records: Path, warm_policy: Path,
                                                             tmp_path: Path) -> None:
    from embodied_r.training.stage import run_training_stage

    cfg = dict(max_steps_per_stage=4, save_steps=1, save_total_limit=10)
    whole = run_training_stage(records, str(warm_policy), tmp_path / "whole", STAGE, grpo_cfg(**cfg))

    out = tmp_path / "killed"
    checkpoints = partial_path(out) / "checkpoints"
    code = (
        "from pathlib import Path\n"
        "from embodied_r.training.stage import run_training_stage\n"
        "from embodied_r.training.config import GRPOStageConfig, TrainingConfig\n"
        f"cfg = TrainingConfig.model_validate_json({grpo_cfg(**cfg).model_dump_json()!r})\n"
        f"run_training_stage(Path({str(records)!r}), {str(warm_policy)!r}, Path({str(out)!r}),\n"
        f"                   GRPOStageConfig.model_validate_json({STAGE.model_dump_json()!r}), cfg)\n"
    )
    # Killed (the stage and its trainer child) once the step-2 checkpoint is saved.
    kill_at_item(code, "train", 2, tmp_path)
    assert (checkpoints / "checkpoint-2" / "trainer_state.json").is_file()
    assert not out.exists() and not (checkpoints / "checkpoint-3").exists()

    resumed = run_training_stage(records, str(warm_policy), out, STAGE, grpo_cfg(**cfg))
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 4
    assert changed(weights(tmp_path / "whole" / "model"), weights(out / "model")) == []
    assert resumed["final_reward"] == whole["final_reward"]


def test_killed_sft_resumes_to_the_uninterrupted_result(records: Path, tmp_path: Path) -> None:
    from embodied_r.training.sft import run_sft

    cfg = sft_cfg(max_steps=6, save_steps=1)
    whole = run_sft(records, "tiny:lm", tmp_path / "whole", cfg)
    out = tmp_path / "killed"
    checkpoints = partial_path(out) / "checkpoints"
    code = (
        "from pathlib import Path\n"
        "from embodied_r.training.sft import run_sft\n"
        "from embodied_r.training.config import SFTConfig\n"
        f"run_sft(Path({str(records)!r}), 'tiny:lm', Path({str(out)!r}),\n"
        f"        SFTConfig.model_validate_json({cfg.model_dump_json()!r}))\n"
    )
    kill_at_item(code, "train", 3, tmp_path)  # once the step-3 checkpoint is saved
    assert (checkpoints / "checkpoint-3" / "trainer_state.json").is_file()
    assert not (checkpoints / "checkpoint-4").exists()
    resumed = run_sft(records, "tiny:lm", out, cfg)
    assert resumed["resumed_from_step"] == 3 and resumed["steps"] == 6
    assert changed(weights(tmp_path / "whole" / "model"), weights(out / "model")) == []
    assert resumed["final_loss"] == whole["final_loss"]
