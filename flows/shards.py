"""A stage's shards on its work pool: one flow run of the stage's deployment per shard, waited on,
then the stage itself, which only merges; a finished shard is not sent again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from embodied_r.errors import ShardRunFailed
from embodied_r.io import is_complete
from embodied_r.pipeline import execute
from embodied_r.shards import SHARD_INPUT, parse_selection, shard_folder
from embodied_r.stage_kinds import kind_of
from embodied_r.stage_plan import Plan, StagePlan
from flows.runner import plan_of, run_deployment_of, scoped_env
from flows.waiting import wait_for_runs


def shard_count(sp: StagePlan) -> int:
    return int(sp.config.get("shards") or 1)


def unfinished(stages: dict[str, StagePlan], names: list[str]) -> tuple[int, list[int]]:
    """The shard count of stages ``names`` (one kind) and the 0-based shards not yet finished
    for some unfinished stage among them."""
    count = max((shard_count(stages[n]) for n in names), default=1)
    if count <= 1:
        return count, []
    open_stages = [Path(stages[n].out) for n in names if shard_count(stages[n]) == count and not stages[n].complete]
    return count, [i for i in range(count) if any(not is_complete(shard_folder(out, i, count)) for out in open_stages)]


def run_shard(stages: Plan, kind: str, shard: str) -> dict[str, Any]:
    """What a shard's flow run does: shard ``shard`` ("INDEX/COUNT") of every unfinished stage
    of ``kind`` that is split in COUNT shards. No MLflow run: the merge records the stage."""
    done: dict[str, Any] = {}
    with scoped_env(EMBODIED_R_HOME=str(stages.root)):
        for name, sp in stages.items():
            if sp.kind != kind or sp.complete:
                continue
            parse_selection(shard, shard_count(sp))  # a shard the recipe does not have: one clear line
            done[name] = execute(replace(sp, inputs={**sp.inputs, SHARD_INPUT: shard}))
    return {"shard": shard, "stages": done}


def dispatch_shards(deployment: str, kind: str, stages: dict[str, StagePlan], names: list[str],
                    parameters: dict[str, Any], poll_seconds: float = 2.0) -> list[str]:
    """A flow run of ``deployment`` for each unfinished shard of stages ``names``; waits for
    all, then raises naming every shard that did not complete. Returns the shard runs' names."""
    from prefect.deployments import run_deployment

    count, todo = unfinished(stages, names)
    if not todo:
        return []
    runs = {i: run_deployment(deployment, parameters={**parameters, "shard": f"{i + 1}/{count}"}, timeout=0)
            for i in todo}
    ended = wait_for_runs(runs, poll_seconds)
    failed = [f"shard {i + 1} (flow run {r.name}: {r.state.type.value} {r.state.message or ''})".strip()
              for i, r in sorted(ended.items()) if not r.state.is_completed()]
    if failed:
        raise ShardRunFailed(f"stage {kind!r}: {len(failed)} of {count} shards did not complete: "
                             f"{'; '.join(failed)}. The finished shards are kept; run again and only the "
                             "others are sent")
    return [r.name for _, r in sorted(ended.items())]


def stage_parameters(stages: Plan, parent_run_id: str | None) -> dict[str, Any]:
    """The parameters of a stage kind's flow run (and of its shards' runs) as a dispatching
    run sends them: the plan itself, so nothing on the pools plans again."""
    return {"recipe": stages.recipe_name, "plan": stages.to_json(), "home": str(stages.root),
            "mlflow_parent_run_id": parent_run_id}


def dispatch_kind(kind: str, stages: Plan, names: list[str], parameters: dict[str, Any]) -> str:
    """Stages ``names`` of ``kind`` through its deployment: unfinished shards first, each a flow run,
    then the run that merges them and records the stages. Returns that run's name."""
    dispatch_shards(kind_of(kind).deployment, kind, stages, names, parameters)
    return run_deployment_of(kind, parameters)


def dispatch_stage(recipe_ref: str, kind: str, root: Path, overrides: dict[str, Any] | None = None,
                   parent_run_id: str | None = None) -> str:
    """One stage kind of a recipe through its deployment, as the full pipeline sends it."""
    stages = plan_of("embodied-r", recipe_ref, overrides, root)
    return dispatch_kind(kind, stages, stages.of_kind(kind), stage_parameters(stages, parent_run_id))
