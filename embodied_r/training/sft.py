"""The SFT baseline: supervised fine-tuning on the same GRPO records, evaluated the same way.

The paper sets RL against SFT (Table 1, "SFT Qwen2.5-VL-3B/7B"). Its SFT models learn the
ground-truth answers of the training questions; the benchmarks hold no reasoning, so
there is none to imitate. Here the reasoner LM learns, from the same prompt the policy
sees (system + user turn with the video as text), the target
``<think>{think}</think><answer>{solution}</answer>``: the answer supervised, wrapped in
the output format so evaluation reads it as it reads the policy's, and a fixed neutral
``think`` line that does not give the answer away (so the consistency measure is not
handed a free pass).

``run_sft`` follows the stage convention and trains in a child process
(``python -m embodied_r.training.sft_child SPEC``, or under ``accelerate launch``), like GRPO.
``embodied_r.lifecycle.sft_baseline`` trains it on a recipe's converted records and evaluates it.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from embodied_r import schemas
from embodied_r.io import (
    is_complete,
    read_summary,
    stage_folder,
    table_from_records,
    write_parquet_atomic,
    write_summary,
)
from embodied_r.training.config import DEFAULT_THINK, SFTConfig
from embodied_r.training.environment import CHECKPOINTS, run_child
from embodied_r.training.disk import check_disk, planned_steps, world_size
from embodied_r.training.stage import check_inputs, existing_checkpoints, local_model


def sft_target(record: dict[str, Any], think: str = DEFAULT_THINK) -> str:
    """The completion SFT teaches for one record."""
    return f"<think>{think}</think><answer>{record['solution']}</answer>"


def run_sft(records: Path, init_model: str, out: Path, cfg: SFTConfig,
            mlflow_run_id: str | None = None, tracking_uri: str | None = None,
            traces: list[dict[str, Any]] | None = None, stage: str = "sft") -> dict[str, Any]:
    """Fine-tune ``init_model`` on ``records/train.parquet`` into ``out/model``.

    With ``traces`` (records with a ``target`` column, e.g. the warm start's reasoning
    traces) it trains on those instead; they are kept in ``out/traces/train.parquet``.

    Writes ``out/model/`` (full weights and tokenizer, LoRA merged in), ``train.log``,
    ``failures.parquet`` (records too long for ``max_length``) and ``summary.json``. A
    finished run is not redone; a crashed one resumes from its last checkpoint. ``stage``
    names the trainer's step lines on the terminal.
    """
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    init_model = local_model(init_model)
    check_inputs(records, init_model, stage="sft")
    rows = pq.read_metadata(Path(records) / "train.parquet").num_rows
    per_step = world_size(cfg) * cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    check_disk(out, init_model, cfg, planned_steps(rows, cfg.epochs, per_step, cfg.max_steps), "SFT",
               existing_checkpoints(out))
    started = time.monotonic()
    with stage_folder(out) as work:
        if traces is not None:
            records = work / "traces"
            records.mkdir(exist_ok=True)
            write_parquet_atomic(pa.Table.from_pylist(traces), records / "train.parquet")
        spec = {
            "records": str(Path(records).resolve()),
            "init_model": init_model,
            "work": str(work.resolve()),
            "stage": stage,  # names the child's step lines
            # SFT's own fields only: a subclass (the warm start's config) adds trace settings.
            "sft": cfg.model_dump(mode="json", include=set(SFTConfig.model_fields)),
        }
        result = run_child("embodied_r.training.sft_child", spec, work, cfg, mlflow_run_id, "SFT", uri=tracking_uri)
        if not cfg.keep_checkpoints:
            shutil.rmtree(work / CHECKPOINTS, ignore_errors=True)
        failures = [{"stage": "sft", "item": uid, "reason": "too_long"} for uid in result.pop("too_long", [])]
        write_parquet_atomic(table_from_records(failures, schemas.FAILURES), work / "failures.parquet")
        summary = {
            "stage": "sft",
            "init_model": init_model,
            "model": str(out / "model"),
            "items": result.get("train_records", 0) + len(failures),
            "done": result.get("train_records", 0),
            "failed": len(failures),
            "failure_reasons": {"too_long": len(failures)} if failures else {},
            "parent_seconds": round(time.monotonic() - started, 3),
            **result,
        }
        write_summary(work, summary)
    return summary
