"""The SFT run both pipelines share, on the parent's side: the disk check and the trainer
child. It imports nothing of either pipeline's own."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from embodied_r import schemas
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.training.checkpoints import existing_checkpoints
from embodied_r.training.disk import check_disk, planned_steps, world_size
from embodied_r.training.environment import CHECKPOINTS, run_child
from embodied_r.training.sft_settings import SFTSettings


def check_sft_disk(out: Path, init_model: str, cfg: SFTSettings, examples: int, what: str) -> None:
    per_step = world_size(cfg) * cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    check_disk(out, init_model, cfg, planned_steps(examples, cfg.epochs, per_step, cfg.max_steps), what,
               existing_checkpoints(out))


def sft_in_child(work: Path, spec: dict[str, Any], cfg: SFTSettings, stage: str, what: str,
                 mlflow_run_id: str | None = None, uri: str | None = None) -> dict[str, Any]:
    """The child's result with the stage's counts: examples left out as too long are its
    failures. The checkpoints go once the model is saved, unless kept."""
    spec = {**spec, "work": str(work.resolve()), "stage": stage}  # the stage names the step lines
    result = run_child("embodied_r.training.sft_child", spec, work, cfg, mlflow_run_id, what, uri=uri)
    if not cfg.keep_checkpoints:
        shutil.rmtree(work / CHECKPOINTS, ignore_errors=True)
    failures = [{"stage": stage, "item": uid, "reason": "too_long"} for uid in result.pop("too_long", [])]
    write_parquet_atomic(table_from_records(failures, schemas.FAILURES), work / "failures.parquet")
    done = result.get("train_records", 0)
    return {"items": done + len(failures), "done": done, "failed": len(failures),
            "failure_reasons": {"too_long": len(failures)} if failures else {}, **result}


