"""One flow per stage, for a rerun of one stage by hand, from the UI, or by the full
pipeline when it sends each stage to its own work pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from prefect import flow

from embodied_r import paths
from embodied_r.config import load_recipe
from embodied_r.pipeline import plan
from flows.prefect_views import flow_run_name, publish_result, tag_flow_run
from flows.runner import run_in_process
from flows.shards import run_shard

# Stage kinds in run order, and the work pool each runs on when pools are used.
STAGE_POOLS: dict[str, str] = {
    "download": "cpu",
    "preprocess": "cpu",
    "keyframes": "cpu",
    "perception": "gpu-infer",
    "convert": "cpu",
    "warmstart": "gpu-train",
    "train": "gpu-train",
    "evaluate": "gpu-infer",
}


def flow_name(kind: str) -> str:
    return f"embodied-r-{kind}"


def deployment_name(kind: str) -> str:
    """``<flow>/<deployment>`` as ``run_deployment`` and ``prefect deployment run`` take it."""
    return f"{flow_name(kind)}/{kind}"


def run_stage_kind(kind: str, recipe: str, refresh: bool, overrides: dict[str, Any] | None,
                   home: str | None, mlflow_parent_run_id: str | None, shard: str | None = None) -> dict[str, Any]:
    root = paths.claim_home(Path(home).expanduser().resolve() if home else paths.home())
    rec = load_recipe(recipe, overrides)
    tag_flow_run(rec.name)
    if shard:
        return run_shard(rec, root, kind, shard)
    # Every stage of the kind: the three GRPO stages, or evaluate with its baselines.
    names = [name for name, sp in plan(rec, root).items() if sp.kind == kind]
    result = run_in_process(rec, root, refresh=[names[0]] if refresh else None, only=names,
                            parent_run_id=mlflow_parent_run_id)
    publish_result(rec.name, result)
    return result


def _make(kind: str) -> Callable[..., dict[str, Any]]:
    def stage_flow(recipe: str = "demo", refresh: bool = False, overrides: dict[str, Any] | None = None,
                   home: str | None = None, mlflow_parent_run_id: str | None = None,
                   shard: str | None = None) -> dict[str, Any]:
        return run_stage_kind(kind, recipe, refresh, overrides, home, mlflow_parent_run_id, shard)

    stage_flow.__name__ = f"{kind}_flow"
    stage_flow.__doc__ = (
        f"The {kind} stage alone with a recipe; its inputs must exist. ``refresh`` recomputes it "
        "and discards what depends on it. ``mlflow_parent_run_id`` nests its MLflow run under a "
        "pipeline run (set by the full pipeline when it dispatches stages to work pools). ``shard`` "
        "(\"2/4\") does that shard alone of a stage the recipe splits in shards, for the dispatching "
        "flow, which then runs the stage once more to merge them."
    )
    return flow(name=flow_name(kind), log_prints=True, flow_run_name=flow_run_name)(stage_flow)


download_flow = _make("download")
preprocess_flow = _make("preprocess")
keyframes_flow = _make("keyframes")
perception_flow = _make("perception")
convert_flow = _make("convert")
warmstart_flow = _make("warmstart")
train_flow = _make("train")
evaluate_flow = _make("evaluate")

STAGE_FLOWS = {
    "download": download_flow,
    "preprocess": preprocess_flow,
    "keyframes": keyframes_flow,
    "perception": perception_flow,
    "convert": convert_flow,
    "warmstart": warmstart_flow,
    "train": train_flow,
    "evaluate": evaluate_flow,
}
