"""The ``embodied-r`` flow: the whole pipeline, in this process or stage by stage on work pools."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger

from embodied_r import paths
from embodied_r.config import Recipe, load_recipe
from embodied_r.pipeline import plan, select_stages
from embodied_r.tracking import tracking_uri
from embodied_r.io import read_summary
from flows.runner import (
    discard_refreshed,
    finish_parent,
    log_cached_stage,
    open_tracker,
    run_in_process,
    scoped_env,
)
from flows.mlflow_runs import run_url, runs_url
from flows.prefect_views import flow_run_name, publish_result, tag_flow_run
from flows.shards import dispatch_shards
from flows.stages import STAGE_POOLS, deployment_name


class StageRunFailed(RuntimeError):
    """A stage's flow run, sent to a work pool, did not complete."""


def stage_deployments_available() -> bool:
    """True when a Prefect server is configured and every stage flow is deployed."""
    if not os.environ.get("PREFECT_API_URL"):
        return False
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            for kind in STAGE_POOLS:
                client.read_deployment_by_name(deployment_name(kind))
        except ObjectNotFound:
            return False
    return True


def run_dispatched(recipe_ref: str, recipe: Recipe, root: Path, refresh: list[str] | None,
                   overrides: dict[str, Any] | None) -> dict[str, Any]:
    """Send each stage kind to its deployment (and so its pool) in order, and wait for it.

    A child flow run that fails does not raise here by itself: its final state is checked
    and the pipeline stops with the child's own message.
    """
    from prefect.deployments import run_deployment

    logger = get_run_logger()
    stages = plan(recipe, root)
    selected = select_stages(stages, None, recipe.name)
    refreshed = discard_refreshed(stages, refresh or [])
    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        tracker = open_tracker(recipe, root, "pipeline", selected, refreshed)
    cached: list[str] = []
    try:
        for kind in STAGE_POOLS:
            names = [n for n in selected if stages[n].kind == kind]
            if not names:
                continue
            if all(stages[n].complete for n in names):
                # Finished work needs no worker (and no GPU): record it as served from cache.
                with scoped_env(MLFLOW_TRACKING_URI=uri):
                    for name in names:
                        log_cached_stage(tracker, stages[name], read_summary(Path(stages[name].out)))
                cached += names
                logger.info("%s: already done, not dispatched", kind)
                continue
            parameters = {"recipe": recipe_ref, "overrides": overrides, "home": str(root),
                          "mlflow_parent_run_id": tracker.parent_run_id}
            # A stage split in shards: one flow run per shard first; the stage's run then merges.
            dispatch_shards(deployment_name(kind), kind, stages, names, parameters)
            child = run_deployment(deployment_name(kind), parameters=parameters, timeout=None, poll_interval=2)
            state = child.state
            if state is None or not state.is_completed():
                raise StageRunFailed(
                    f"stage {kind!r} (flow run {child.name}, id {child.id}) ended "
                    f"{state.type.value if state else 'without a state'}: {state.message if state else ''}"
                )
            logger.info("%s: done on pool %s (flow run %s)", kind, STAGE_POOLS[kind], child.name)
    except BaseException:
        tracker.finish(tracker.parent_run_id, "FAILED")
        raise
    with scoped_env(MLFLOW_TRACKING_URI=uri):
        final = finish_parent(tracker, stages, cached=cached, selected=selected, recipe=recipe)
    return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri, "cached": cached,
            "experiment_id": tracker.experiment_id,
            "mlflow_run_url": run_url(uri, tracker.experiment_id, tracker.parent_run_id or ""),
            "mlflow_runs_url": runs_url(uri, tracker.experiment_id),
            "stages": {n: stages[n].out for n in selected}, "evaluation": final, "dispatched": True}


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
