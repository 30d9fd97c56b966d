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
(``python -m embodied_r.train_sft SPEC``, or under ``accelerate launch``), like GRPO.
``sft_baseline`` trains on a recipe's converted records and evaluates the model, each
step in its own MLflow run under one parent.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from embodied_r import schemas
from embodied_r.io import (
    is_complete,
    read_summary,
    stage_folder,
    table_from_records,
    write_parquet_atomic,
    write_summary,
)
from embodied_r.training import (
    CHECKPOINTS,
    TrainerEnvironment,
    TrainingConfig,
    check_inputs,
    local_model,
    run_child,
)

DEFAULT_THINK = "I compare what the video showed with each option before answering."
SFT_MODULES = ("sft", "train_sft", "train_grpo", "training", "records", "answers")


class SFTConfig(TrainerEnvironment):
    # The paper's SFT baselines trained for a few epochs at a usual full fine-tuning rate.
    epochs: float = Field(3.0, gt=0)
    learning_rate: float = Field(1e-5, gt=0)
    per_device_train_batch_size: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(8, ge=1)
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    # Prompt and target tokens together; longer records are left out (and listed), since
    # truncation would cut the answer away. The original trained with 6144.
    max_length: int = Field(6144, ge=16)
    max_steps: int | None = Field(None, ge=1)
    think: str = Field(DEFAULT_THINK, min_length=1)
    # Further TRL SFTConfig arguments, passed through as they are.
    sft_args: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_training(cls, training: TrainingConfig, **updates: Any) -> "SFTConfig":
        """SFT run where the recipe's GRPO stages run: same device, launcher, LoRA and
        step cap; SFT's own learning rate and batch."""
        shared = set(TrainerEnvironment.model_fields)
        data = training.model_dump(include=shared)
        data["max_steps"] = training.max_steps_per_stage
        data.update(updates)
        return cls.model_validate(data)


def sft_target(record: dict[str, Any], think: str = DEFAULT_THINK) -> str:
    """The completion SFT teaches for one record."""
    return f"<think>{think}</think><answer>{record['solution']}</answer>"


def run_sft(records: Path, init_model: str, out: Path, cfg: SFTConfig,
            mlflow_run_id: str | None = None, tracking_uri: str | None = None) -> dict[str, Any]:
    """Fine-tune ``init_model`` on ``records/train.parquet`` into ``out/model``.

    Writes ``out/model/`` (full weights and tokenizer, LoRA merged in), ``train.log``,
    ``failures.parquet`` (records too long for ``max_length``) and ``summary.json``. A
    finished run is not redone; a crashed one resumes from its last checkpoint.
    """
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    init_model = local_model(init_model)
    check_inputs(records, init_model, stage="sft")
    started = time.monotonic()
    with stage_folder(out) as work:
        spec = {
            "records": str(Path(records).resolve()),
            "init_model": init_model,
            "work": str(work.resolve()),
            "sft": cfg.model_dump(mode="json"),
        }
        result = run_child("embodied_r.train_sft", spec, work, cfg, mlflow_run_id, "SFT", uri=tracking_uri)
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


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def sft_config_for(recipe: Any, **updates: Any) -> SFTConfig:
    """The recipe's ``sft`` section when it has one, else SFT derived from its training."""
    own = getattr(recipe, "sft", None)
    if own is not None:
        return own.model_copy(update=updates) if updates else own
    return SFTConfig.from_training(recipe.training, **updates)


def sft_baseline(recipe: Any, cfg: SFTConfig | None = None, init_model: str | None = None,
                 root: Path | None = None, refresh: bool = False) -> dict[str, Any]:
    """Train the SFT baseline on the recipe's converted records and evaluate it.

    Folders: ``<home>/stages/sft/<key>`` and ``<home>/stages/sft_evaluate/<key>``, keyed
    by the records, the configs and the code, like the pipeline's stages. Returns both
    summaries, the folders and the MLflow parent run id.
    """
    from embodied_r.evaluation import run_evaluation
    from embodied_r.paths import home
    from embodied_r.pipeline import StageError, code_version, module_version, plan
    from embodied_r.tracking import Tracker, record_stage, tracking_uri

    root = Path(root) if root else home()
    cfg = cfg or sft_config_for(recipe)
    stages = plan(recipe, root)
    convert = stages["convert"]
    if not convert.complete:
        raise StageError(
            f"the SFT baseline trains on the convert stage's records, which have not been made with "
            f"this recipe: run `embodied-r convert --recipe {recipe.name}` first"
        )
    init_model = init_model or recipe.training.policy
    code = {m: module_version(m) for m in SFT_MODULES}
    sft_key = _digest({"sft": cfg.model_dump(mode="json"), "init_model": init_model,
                       "records": convert.key, "code": code})
    sft_out = root / "stages" / "sft" / sft_key
    eval_cfg = recipe.evaluation
    eval_key = _digest({"evaluation": eval_cfg.model_dump(mode="json"), "sft": sft_key,
                        "code": code_version("evaluate")})
    eval_out = root / "stages" / "sft_evaluate" / eval_key
    if refresh:
        for folder in (eval_out, sft_out):
            for path in (folder, folder.with_name(folder.name + ".partial")):
                shutil.rmtree(path, ignore_errors=True)

    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    tracker = Tracker.open(recipe.tracking.experiment, uri, root).start_parent(
        name=f"{recipe.name}-sft-baseline",
        tags={"recipe": recipe.name, "baseline": "sft"},
        params={"recipe": recipe.model_dump(mode="json"), "sft": cfg.model_dump(mode="json")},
    )
    summaries: dict[str, dict[str, Any]] = {}
    try:
        # Params under a prefix: the trainer logs its own arguments (learning_rate, ...)
        # into the same run, and MLflow refuses a param logged twice with two values.
        for name, out, config, work in (
            ("sft", sft_out, {"sft": cfg.model_dump(mode="json"), "init_model": init_model}, "train"),
            ("sft_evaluate", eval_out, {"evaluation": eval_cfg.model_dump(mode="json")}, "evaluate"),
        ):
            cached = is_complete(out)
            run_id = tracker.start_stage(name, config, tags={
                "output": str(out), "cache_hit": str(cached).lower(), "baseline": "sft"})
            try:
                if work == "train":
                    summary = run_sft(Path(convert.out), init_model, out, cfg, mlflow_run_id=run_id,
                                      tracking_uri=uri)
                else:
                    summary = run_evaluation(Path(convert.out), str(sft_out / "model"), out, eval_cfg)
            except BaseException:
                tracker.finish(run_id, "FAILED")
                raise
            record_stage(tracker, run_id, out, summary)
            tracker.finish(run_id)
            summaries[name] = summary
    except BaseException:
        tracker.finish(tracker.parent_run_id, "FAILED")
        raise
    evaluation = summaries["sft_evaluate"]
    tracker.log_metrics(tracker.parent_run_id, {
        k: float(v) for k, v in evaluation.items()
        if k.startswith("accuracy") and isinstance(v, (int, float)) and not isinstance(v, bool)})
    tracker.finish(tracker.parent_run_id)
    return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri,
            "sft": summaries["sft"], "evaluation": evaluation,
            "stages": {"sft": str(sft_out), "sft_evaluate": str(eval_out)}}


__all__ = ["DEFAULT_THINK", "SFTConfig", "run_sft", "sft_baseline", "sft_config_for", "sft_target"]
