"""The SFT baseline beside the GRPO reasoner: train on a recipe's converted records and
evaluate the model the same way, each step in its own MLflow run under one parent."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from embodied_r.errors import StageError
from embodied_r.evaluation.config import EVALUATE
from embodied_r.evaluation.stage import run_evaluation
from embodied_r.io import is_complete, payload_key
from embodied_r.pipeline import Plan
from embodied_r.code_keys import closure, code_version, modules_version, said
from embodied_r.tracking.runs import Tracker, record_stage
from embodied_r.tracking.store import tracking_uri
from embodied_r.training.config import SFTConfig
from embodied_r.training.sft import run_sft

# The SFT trainer's parent and child, and all they import, key the SFT folder.
SFT_MODULES = ("embodied_r.training.sft", "embodied_r.training.sft_child")


def _digest(payload: dict[str, Any]) -> str:
    return payload_key(payload)


def sft_config_for(recipe: Any, **updates: Any) -> SFTConfig:
    """The recipe's ``sft`` section when it has one, else SFT derived from its training."""
    own = getattr(recipe, "sft", None)
    if own is not None:
        return own.model_copy(update=updates) if updates else own
    return SFTConfig.from_training(recipe.training, **updates)


def evaluation_of(recipe: Any, stages: Plan) -> Any:
    """The SFT model's evaluation settings: the plan's, with its consistency judge resolved
    (``warmstart`` is the warm start's folder), so it is judged as the GRPO-trained model is."""
    return type(recipe.evaluation).model_validate(stages["evaluate"].config)


def _folders(recipe: Any, stages: Plan, cfg: SFTConfig, init_model: str) -> tuple[Path, Path, Any]:
    """(SFT folder, evaluation folder, evaluation settings), keyed like the pipeline's stages."""
    convert = stages["convert"]
    code = modules_version(sorted({m for root_module in SFT_MODULES for m in closure(root_module, said(init_model))}))
    sft_key = _digest({"sft": cfg.model_dump(mode="json"), "init_model": init_model,
                       "records": convert.key, "code": code})
    sft_out = stages.root / "stages" / "sft" / sft_key
    eval_cfg = evaluation_of(recipe, stages)
    eval_key = _digest({"evaluation": eval_cfg.model_dump(mode="json"), "sft": sft_key,
                        "code": code_version(EVALUATE.runner)})
    return sft_out, stages.root / "stages" / "sft_evaluate" / eval_key, eval_cfg


def _run_steps(tracker: Tracker, uri: str, records: Path, init_model: str, cfg: SFTConfig, sft_out: Path,
               eval_out: Path, eval_cfg: Any) -> dict[str, dict[str, Any]]:
    """Train, then evaluate, each in its own child run; a failure fails its run and the parent."""
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
                    summary = run_sft(records, init_model, out, cfg, mlflow_run_id=run_id, tracking_uri=uri)
                else:
                    summary = run_evaluation(records, str(sft_out / "model"), out, eval_cfg)
            except BaseException:
                tracker.finish(run_id, "FAILED")
                raise
            record_stage(tracker, run_id, out, summary)
            tracker.finish(run_id)
            summaries[name] = summary
    except BaseException:
        tracker.finish(tracker.parent_run_id, "FAILED")
        raise
    return summaries


def sft_baseline(recipe: Any, stages: Plan, cfg: SFTConfig | None = None, init_model: str | None = None,
                 refresh: bool = False) -> dict[str, Any]:
    """Train the SFT baseline on the recipe's converted records and evaluate it, in
    ``<home>/stages/sft/<key>`` and ``<home>/stages/sft_evaluate/<key>``. Returns both
    summaries, the folders and the MLflow parent run id."""
    root = stages.root
    cfg = cfg or sft_config_for(recipe)
    convert = stages["convert"]
    if not convert.complete:
        raise StageError(
            f"the SFT baseline trains on the convert stage's records, which have not been made with "
            f"this recipe: run `embodied-r convert --recipe {recipe.name}` first"
        )
    init_model = init_model or recipe.training.policy
    sft_out, eval_out, eval_cfg = _folders(recipe, stages, cfg, init_model)
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
    summaries = _run_steps(tracker, uri, Path(convert.out), init_model, cfg, sft_out, eval_out, eval_cfg)
    evaluation = summaries["sft_evaluate"]
    tracker.log_metrics(tracker.parent_run_id, {
        k: float(v) for k, v in evaluation.items()
        if k.startswith("accuracy") and isinstance(v, (int, float)) and not isinstance(v, bool)})
    tracker.finish(tracker.parent_run_id)
    return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri,
            "sft": summaries["sft"], "evaluation": evaluation,
            "stages": {"sft": str(sft_out), "sft_evaluate": str(eval_out)}}
