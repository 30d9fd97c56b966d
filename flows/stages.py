"""One flow per Embodied-R stage kind (``stage_kinds``), for a rerun of one stage by hand,
from the UI, or by the full pipeline when it sends each stage to its own work pool. Each is a
module attribute ``<kind>_flow``, as ``prefect.yaml``'s entrypoints name it."""

from __future__ import annotations

from typing import Any, Callable

from prefect import flow

from embodied_r.stage_kinds import kind_of, kinds
from flows.cancel_watch import watch_cancel
from embodied_r.tracking.record import Recorder
from flows.prefect_views import flow_run_name, publish_result, tag_flow_run
from flows.runner import given_plan, run_plan
from flows.shards import run_shard


def run_stage_kind(kind: str, recipe: str, refresh: bool, overrides: dict[str, Any] | None,
                   home: str | None, mlflow_parent_run_id: str | None, shard: str | None = None,
                   plan: dict[str, Any] | None = None) -> dict[str, Any]:
    watch_cancel()
    stages = given_plan(plan, "embodied-r", recipe, overrides, home)
    tag_flow_run(stages.recipe_name)
    if shard:
        return run_shard(stages, kind, shard)
    # Every stage of the kind: the three GRPO stages, or evaluate with its baselines.
    names = stages.of_kind(kind)
    if not names:
        raise ValueError(f"recipe {stages.recipe_name!r} has no {kind} stage")
    result = run_plan(stages, Recorder(stages, kind_of, mlflow_parent_run_id), only=names,
                      refresh=[names[0]] if refresh else None)
    publish_result(stages.recipe_name, result)
    return result


def _make(kind: str) -> Callable[..., dict[str, Any]]:
    def stage_flow(recipe: str = "demo", refresh: bool = False, overrides: dict[str, Any] | None = None,
                   home: str | None = None, mlflow_parent_run_id: str | None = None,
                   shard: str | None = None, plan: dict[str, Any] | None = None) -> dict[str, Any]:
        return run_stage_kind(kind, recipe, refresh, overrides, home, mlflow_parent_run_id, shard, plan)

    stage_flow.__name__ = f"{kind}_flow"
    stage_flow.__doc__ = (
        f"The {kind} stage alone with a recipe; its inputs must exist. ``refresh`` recomputes it "
        "and discards what depends on it. ``mlflow_parent_run_id`` nests its MLflow run under a "
        "pipeline run, and ``plan`` is that run's plan (both set by the full pipeline when it "
        "dispatches stages to work pools). ``shard`` (\"2/4\") does that shard alone of a stage "
        "the recipe splits in shards, for the dispatching flow, which then runs the stage once "
        "more to merge them."
    )
    return flow(name=kind_of(kind).flow_name, log_prints=True, flow_run_name=flow_run_name)(stage_flow)


class _Flows(dict[str, Callable[..., dict[str, Any]]]):
    """One flow per Embodied-R stage kind, made when first asked for."""

    def __missing__(self, name: str) -> Callable[..., dict[str, Any]]:
        kind_of(name)  # an unknown kind is refused by name
        made = self[name] = _make(name)
        return made


STAGE_FLOWS = _Flows({k.name: _make(k.name) for k in kinds("embodied-r")})


def __getattr__(name: str) -> Any:
    """``<kind>_flow``, as ``prefect.yaml``'s entrypoints name each stage's flow."""
    if name.endswith("_flow"):
        return STAGE_FLOWS[name.removesuffix("_flow")]
    raise AttributeError(name)
