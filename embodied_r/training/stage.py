"""The GRPO training stage's parent side: it launches one stage's trainer child, which resumes
from the last checkpoint in the stage's partial folder."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from embodied_r.backends.tokens import check_folder_pad
from embodied_r.io import is_complete, read_summary, stage_folder, write_summary
from embodied_r.training.chain import chain_schedule_steps, chain_source, keep_chain_state
from embodied_r.training.config import GRPOStageConfig, TrainingConfig
from embodied_r.training.disk import check_disk, planned_steps, world_size
from embodied_r.training.checkpoints import existing_checkpoints
from embodied_r.training.environment import CHECKPOINTS, run_child

def schedule_position(init_model: str) -> tuple[int, int]:
    """(global step offset, stage index): a stage from an earlier stage's ``model/`` continues its
    step count, so stages 1 -> 3 draw one curve in MLflow."""
    summary_file = Path(init_model).expanduser().parent / "summary.json"
    if Path(init_model).expanduser().name != "model" or not summary_file.is_file():
        return 0, 1
    try:
        before = read_summary(summary_file.parent)
        return int(before.get("global_step_end", before.get("steps", 0))), int(before.get("stage_index", 1)) + 1
    except (OSError, ValueError, TypeError):
        return 0, 1


def chain_spec(records: Path, init_model: str, stage: GRPOStageConfig, cfg: TrainingConfig,
               chain: list[GRPOStageConfig] | None) -> dict[str, Any]:
    if cfg.stage_chain != "resume":
        return {}
    state, initial = chain_source(init_model)
    steps = stage_steps(records, chain or [stage], cfg)
    return {"state": state, "initial_model": initial, "schedule_steps": chain_schedule_steps(steps)}


def stage_steps(records: Path, stages: list[GRPOStageConfig], cfg: TrainingConfig) -> list[int]:
    rows = pq.read_metadata(Path(records) / "train.parquet").num_rows
    prompts = max(completions_per_step(cfg) // cfg.num_generations, 1)
    return [planned_steps(rows, s.epochs, prompts, cfg.max_steps_per_stage) for s in stages]


def completions_per_step(cfg: TrainingConfig) -> int:
    world = world_size(cfg)
    return world * cfg.per_device_train_batch_size * cfg.accumulation_steps(world)


def stage_spec(records: Path, init_model: str, work: Path, stage: GRPOStageConfig,
               cfg: TrainingConfig, chain: list[GRPOStageConfig] | None = None) -> dict[str, Any]:
    offset, index = schedule_position(init_model)
    return {
        "chain": chain_spec(records, init_model, stage, cfg, chain),
        "records": str(Path(records).resolve()),
        "init_model": init_model,
        "work": str(Path(work).resolve()),
        "stage": stage.model_dump(mode="json"),
        "training": cfg.model_dump(mode="json"),
        "run_name": f"train_{stage.name}",
        "global_step_offset": offset,
        "stage_index": index,
    }


def check_inputs(records: Path, init_model: str, stage: str = "training") -> None:
    train_file = Path(records) / "train.parquet"
    if not train_file.is_file():
        raise FileNotFoundError(f"{stage}: {train_file} does not exist (run the convert stage first)")
    path = Path(init_model).expanduser()
    if path.exists() or init_model.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{stage}: initial model {init_model} is not a model folder (no config.json); "
                "give a finished earlier stage's model/ folder, a hub id, or tiny:lm"
            )
        # A pad token the chat template writes would be masked in every prompt (NaN at the
        # first step on a GPU): refused here, in one line, before the trainer starts.
        check_folder_pad(str(path))


def check_stage_disk(records: Path, init_model: str, out: Path, stage: GRPOStageConfig,
                     cfg: TrainingConfig) -> None:
    (steps,) = stage_steps(records, [stage], cfg)
    # A resume chain keeps each stage's last checkpoint (chain_state/) for the next one.
    check_disk(out, init_model, cfg, steps, f"training stage {stage.name!r}", existing_checkpoints(out),
               kept_after=1 if cfg.stage_chain == "resume" else 0)


def local_model(init_model: str) -> str:
    """``training.policy.training_model``, a local folder made absolute (the child runs elsewhere)."""
    from embodied_r.training.policy import training_model

    resolved = training_model(init_model)
    path = Path(resolved).expanduser()
    return str(path.resolve()) if path.exists() else resolved


def run_training_stage(records: Path, init_model: str, out: Path, stage: GRPOStageConfig,
                       cfg: TrainingConfig, mlflow_run_id: str | None = None,
                       chain: list[GRPOStageConfig] | None = None) -> dict[str, Any]:
    """Train one GRPO stage from ``init_model`` on ``records/train.parquet`` into ``out``.
    ``chain``: every stage of the schedule, which one schedule spans under ``stage_chain: resume``."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    init_model = local_model(init_model)
    check_inputs(records, init_model)
    check_stage_disk(records, init_model, out, stage, cfg)
    started = time.monotonic()
    with stage_folder(out) as work:
        spec = stage_spec(records, init_model, work, stage, cfg, chain)
        result = run_child("embodied_r.training.grpo", spec, work, cfg, mlflow_run_id, spec["run_name"])
        result["chain_state"] = (keep_chain_state(work, move=not cfg.keep_checkpoints)
                                 if cfg.stage_chain == "resume" else None)
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
            "stage_index": spec["stage_index"],
            **result,
        }
        for kept in ("chain_state", "best_model"):  # the child saw the work folder; the stage ends in out
            if result.get(kept):
                summary[kept] = str(out / Path(result[kept]).name)
        write_summary(work, summary)
    return summary




def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    training = TrainingConfig.model_validate({**config["training"], "stages": [config["stage"]],
                                              "python": inputs.get("python") or None})
    chain = [GRPOStageConfig.model_validate(s) for s in config["chain"]] if config.get("chain") else None
    return run_training_stage(Path(inputs["records"]), inputs["init_model"], out,
                              GRPOStageConfig.model_validate(config["stage"]), training,
                              mlflow_run_id=mlflow_run_id, chain=chain)
