"""The ``embodied-r`` flow: the whole pipeline, in this process or stage by stage on work pools."""

from __future__ import annotations

import os
from typing import Any, Literal

from prefect import flow

from embodied_r.stage_kinds import kind_of, kinds
from flows.cancel_watch import watch_cancel
from embodied_r.tracking.record import Recorder
from flows.prefect_views import flow_run_name, publish_result, tag_flow_run
from flows.runner import given_plan, run_plan
from flows.shards import dispatch_kind, stage_parameters

__all__ = ["embodied_r", "stage_deployments_available"]


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


@flow(name="embodied-r", log_prints=True, flow_run_name=flow_run_name)
def embodied_r(recipe: str = "demo", refresh: list[str] | None = None,
               overrides: dict[str, Any] | None = None, home: str | None = None,
               dispatch: Literal["auto", "local", "pools"] = "auto",
               plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """The full pipeline: download -> ... -> evaluate -> promote; ``refresh`` names stages to
    recompute with all that follows. ``dispatch``: ``pools``, ``local``, or ``auto`` (the pools
    when a Prefect server and the stage deployments exist). ``plan``: the caller's (the CLI), else
    made here once and handed to every stage."""
    watch_cancel()
    stages = given_plan(plan, "embodied-r", recipe, overrides, home)
    tag_flow_run(stages.recipe_name)
    record = Recorder(stages, kind_of)
    send = None
    if dispatch == "pools" or (dispatch == "auto" and stage_deployments_available()):
        def send(kind: str, names: list[str]) -> None:
            dispatch_kind(kind, stages, names, stage_parameters(stages, record.parent_run_id))

    result = run_plan(stages, record, refresh=refresh, dispatch=send)
    publish_result(stages.recipe_name, result)
    return result
