"""GRPO training stages: configs and the parent side that launches the trainer.

Each stage runs in a child process (``python -m embodied_r.train_grpo SPEC`` or the
same under ``accelerate launch``): the trainer owns the GPUs, DeepSpeed and its memory,
and a crash leaves the parent able to report it. The child resumes from the last
checkpoint in the stage's partial folder, so a killed stage picks up where it stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from embodied_r.backends import BackendConfig
from embodied_r.io import (
    is_complete,
    read_json,
    read_summary,
    stage_folder,
    write_json_atomic,
    write_summary,
)

SPEC_NAME = "spec.json"
RESULT_NAME = "train_result.json"
LOG_NAME = "train.log"
CHECKPOINTS = "checkpoints"


class GRPOStageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    epochs: float = Field(1.0, gt=0)
    # Reward weights; the paper gives them as ratios (7:3:0, 3:7:0, 1:7:2).
    format_weight: float = Field(0.0, ge=0)
    accuracy_weight: float = Field(0.0, ge=0)
    consistency_weight: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def _some_reward(self) -> "GRPOStageConfig":
        if self.format_weight + self.accuracy_weight + self.consistency_weight <= 0:
            raise ValueError(f"stage {self.name!r}: at least one reward weight must be positive")
        return self


def paper_stages() -> list[GRPOStageConfig]:
    """The paper's schedule: 12 epochs in three stages of changing reward weights."""
    return [
        GRPOStageConfig(name="stage1", epochs=2, format_weight=0.7, accuracy_weight=0.3, consistency_weight=0.0),
        GRPOStageConfig(name="stage2", epochs=2, format_weight=0.3, accuracy_weight=0.7, consistency_weight=0.0),
        GRPOStageConfig(name="stage3", epochs=8, format_weight=0.1, accuracy_weight=0.7, consistency_weight=0.2),
    ]


def _paper_reference() -> BackendConfig:
    # The official reward asked Qwen2.5-VL-3B-Instruct for one letter (temperature 0.1,
    # at most 10 tokens).
    return BackendConfig(model="Qwen/Qwen2.5-VL-3B-Instruct", max_new_tokens=10, temperature=0.1)


class TrainingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The official script trains Qwen2.5-3B-Instruct (the language model of the 3B VL
    # family); any causal LM folder or hub id works, and tiny:lm for the CPU demo.
    policy: str = "Qwen/Qwen2.5-3B-Instruct"
    # Every trainer process builds its own reference from this; on several GPUs point it
    # at a served model (kind "openai") rather than loading one copy per process.
    reference: BackendConfig = Field(default_factory=_paper_reference)
    # The original rewards consistency only for correct answers.
    consistency_requires_correct: bool = True
    stages: list[GRPOStageConfig] = Field(default_factory=paper_stages, min_length=1)

    learning_rate: float = 5e-7
    beta: float = 0.001
    num_generations: int = Field(8, ge=2)
    max_completion_length: int = Field(2048, ge=1)
    # Completions per device per micro-step. 8 x 4 accumulation = 32 completions (4 prompts
    # x 8 generations) per optimizer step, the original's 8 GPUs x 1 x 4.
    per_device_train_batch_size: int = Field(8, ge=1)
    gradient_accumulation_steps: int = Field(4, ge=1)
    temperature: float = Field(1.0, gt=0)
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    max_steps_per_stage: int | None = Field(None, ge=1)  # a cap for the CPU demo
    use_cpu: bool = False
    bf16: bool | None = None  # None: when a GPU is used, not on the CPU
    gradient_checkpointing: bool = True
    seed: int = 42
    logging_steps: int = Field(1, ge=1)
    save_steps: int = Field(100, ge=1)
    save_total_limit: int | None = 2
    keep_checkpoints: bool = False  # checkpoints only serve a resume; the model is saved apart
    log_completions: bool = False
    launcher: Literal["python", "accelerate"] = "python"
    accelerate_config: str | None = None
    # Further GRPOConfig arguments (e.g. use_vllm, vllm_mode, deepspeed), passed through.
    grpo_args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if self.launcher == "python":
            per_step = self.per_device_train_batch_size * self.gradient_accumulation_steps
            if per_step % self.num_generations:
                raise ValueError(
                    f"per_device_train_batch_size x gradient_accumulation_steps = {per_step} completions "
                    f"per step must be divisible by num_generations = {self.num_generations}"
                )
        if self.launcher == "accelerate" and self.accelerate_config and not Path(self.accelerate_config).is_file():
            raise ValueError(f"accelerate_config {self.accelerate_config} does not exist")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        return self


def stage_spec(records: Path, init_model: str, work: Path, stage: GRPOStageConfig,
               cfg: TrainingConfig) -> dict[str, Any]:
    return {
        "records": str(Path(records).resolve()),
        "init_model": init_model,
        "work": str(Path(work).resolve()),
        "stage": stage.model_dump(mode="json"),
        "training": cfg.model_dump(mode="json"),
    }


def _command(spec_path: Path, cfg: TrainingConfig) -> list[str]:
    if cfg.launcher == "accelerate":
        cmd = [sys.executable, "-m", "accelerate.commands.launch"]
        if cfg.accelerate_config:
            cmd += ["--config_file", cfg.accelerate_config]
        return cmd + ["-m", "embodied_r.train_grpo", str(spec_path)]
    return [sys.executable, "-m", "embodied_r.train_grpo", str(spec_path)]


def _child_env(mlflow_run_id: str | None) -> dict[str, str]:
    env = dict(os.environ)
    # The child must import this very package, installed or not.
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.pop("MLFLOW_RUN_ID", None)
    if mlflow_run_id:
        from embodied_r.tracking import tracking_uri

        env["MLFLOW_RUN_ID"] = mlflow_run_id
        env["MLFLOW_TRACKING_URI"] = tracking_uri()
    return env


def _stream(cmd: list[str], env: dict[str, str], log_path: Path) -> int:
    """Run ``cmd``, copying its output line by line to our stdout and to ``log_path``."""
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", bufsize=1)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                log_file.write(line)
                log_file.flush()
            return proc.wait()
        except BaseException:
            # Interrupted: do not leave a trainer running without its parent.
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


def _check_inputs(records: Path, init_model: str) -> None:
    train_file = Path(records) / "train.parquet"
    if not train_file.is_file():
        raise FileNotFoundError(f"training: {train_file} does not exist (run the convert stage first)")
    path = Path(init_model).expanduser()
    if path.exists() or init_model.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"training: initial model {init_model} is not a model folder (no config.json); "
                "give a finished earlier stage's model/ folder, a hub id, or tiny:lm"
            )


def run_training_stage(records: Path, init_model: str, out: Path, stage: GRPOStageConfig,
                       cfg: TrainingConfig, mlflow_run_id: str | None = None) -> dict[str, Any]:
    """Train one GRPO stage from ``init_model`` on ``records/train.parquet`` into ``out``.

    Writes ``out/model/`` (weights and tokenizer), ``train.log`` and ``summary.json``
    (steps, seconds, seconds per step, final reward means, KL). A finished stage is not
    retrained; a crashed one resumes from its last checkpoint. With ``mlflow_run_id`` the
    trainer logs its per-step metrics into that run (tracking URI from the environment).
    """
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    from embodied_r.tiny_models import resolve_model

    init_model = resolve_model(init_model)
    _check_inputs(records, init_model)
    started = time.monotonic()
    with stage_folder(out) as work:
        spec_path = work / SPEC_NAME
        write_json_atomic(spec_path, stage_spec(records, init_model, work, stage, cfg))
        result_path = work / RESULT_NAME
        if result_path.exists():
            result_path.unlink()  # a result left by an attempt whose parent died after it
        rc = _stream(_command(spec_path, cfg), _child_env(mlflow_run_id), work / LOG_NAME)
        if rc != 0 or not result_path.is_file():
            raise RuntimeError(
                f"training stage {stage.name!r} failed (exit code {rc}); see {work / LOG_NAME}. "
                f"Its checkpoints stay in {work}, and a re-run resumes from the last one."
            )
        result = read_json(result_path)
        if not cfg.keep_checkpoints:
            shutil.rmtree(work / CHECKPOINTS, ignore_errors=True)
        summary = {
            "stage": stage.name,
            "init_model": init_model,
            "model": str(out / "model"),
            "items": result.get("train_records", 0),
            "done": result.get("train_records", 0),
            "failed": 0,
            "failure_reasons": {},
            "parent_seconds": round(time.monotonic() - started, 3),
            **result,
        }
        write_summary(work, summary)
    return summary


__all__ = [
    "GRPOStageConfig",
    "TrainingConfig",
    "paper_stages",
    "run_training_stage",
    "stage_spec",
]
