"""The ``embodied-r`` flow: the whole pipeline, in this process or stage by stage on work pools."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from prefect import flow

from embodied_r import paths
from embodied_r.config import Recipe, load_recipe
from embodied_r.pipeline import plan, select_stages
from embodied_r.stage_kinds import kinds
from embodied_r.tracking import tracking_uri
from embodied_r.tracking_store import lost_line
from flows.runner import (
    StageRunFailed,
    discard_damaged,
    discard_refreshed,
    evaluation_summary,
    finish_parent,
    open_tracker,
    run_in_process,
    run_stages,
    scoped_env,
)
from flows.mlflow_runs import run_url, runs_url
from flows.prefect_views import flow_run_name, publish_result, tag_flow_run
from flows.shards import dispatch_kind, stage_parameters

__all__ = ["StageRunFailed", "embodied_r", "run_dispatched", "stage_deployments_available"]


def stage_deployments_available() -> bool:
    """True when a Prefect server is configured and every stage flow is deployed."""
    if not os.environ.get("PREFECT_API_URL"):
        return False
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            for kind in kinds("embodied-r"):
                client.read_deployment_by_name(kind.deployment)
        except ObjectNotFound:
            return False
    return True


def run_dispatched(recipe_ref: str, recipe: Recipe, root: Path, refresh: list[str] | None,
                   overrides: dict[str, Any] | None) -> dict[str, Any]:
    """Send each stage kind to its deployment (and so its pool) in order, and wait for it;
    a child flow run that fails stops the pipeline with the child's own message."""
    stages = plan(recipe, root)
    selected = select_stages(stages, None, recipe.name)
    refreshed = discard_refreshed(stages, refresh or [])
    discard_damaged(stages, selected)
    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        tracker = open_tracker(recipe, root, "pipeline", selected, refreshed)

    def dispatch(kind: str, names: list[str], parent_run_id: str) -> None:
        dispatch_kind(kind, stages, names, stage_parameters(recipe_ref, overrides, root, parent_run_id))

    try:
        with scoped_env(MLFLOW_TRACKING_URI=uri):
            cached = run_stages(stages, selected, tracker, dispatch=dispatch)
    except BaseException:
        with tracker.guard("the end of the run"):
            tracker.finish(tracker.parent_run_id, "FAILED")
        raise
    with scoped_env(MLFLOW_TRACKING_URI=uri), tracker.guard("the end of the run"):
        finish_parent(tracker, stages, cached=cached, selected=selected, recipe=recipe)
    return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri, "cached": cached,
            "tracking_lost": lost_line(uri), "experiment_id": tracker.experiment_id,
            "mlflow_run_url": run_url(uri, tracker.experiment_id, tracker.parent_run_id or ""),
            "mlflow_runs_url": runs_url(uri, tracker.experiment_id),
            "stages": {n: stages[n].out for n in selected}, "evaluation": evaluation_summary(stages),
            "dispatched": True}


@flow(name="embodied-r", log_prints=True, flow_run_name=flow_run_name)
def embodied_r(recipe: str = "demo", refresh: list[str] | None = None,
               overrides: dict[str, Any] | None = None, home: str | None = None,
               dispatch: Literal["auto", "local", "pools"] = "auto") -> dict[str, Any]:
    """The full pipeline: download -> preprocess -> keyframes -> perception -> convert ->
    training stages -> evaluate. ``refresh`` names stages to recompute with all that follows.

    ``dispatch``: ``pools`` sends each stage to its work pool through its deployment;
    ``local`` runs every stage in this process; ``auto`` uses the pools when a Prefect
    server is configured and the stage deployments exist, else runs here (the embedded
    default).
    """
    root = paths.claim_home(Path(home).expanduser().resolve() if home else paths.home())
    rec = load_recipe(recipe, overrides)
    tag_flow_run(rec.name)
    use_pools = dispatch == "pools" or (dispatch == "auto" and stage_deployments_available())
    if use_pools:
        result = run_dispatched(recipe, rec, root, refresh, overrides)
    else:
        result = run_in_process(rec, root, refresh=refresh)
    publish_result(rec.name, result)
    return result
