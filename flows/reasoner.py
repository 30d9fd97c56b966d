"""The ``embodied-reasoner`` flow: data -> SFT imitation -> exploration (rejection sampling)
-> SFT exploration -> SFT correction -> evaluation, each stage a cached Prefect task with
its own MLflow child run under one parent run. ``only`` reruns chosen stages (their inputs
must exist); ``refresh`` recomputes stages and everything after them.

On the work pools (``dispatch="pools"``) each group of stages is sent to its deployment of
``embodied-reasoner-stage``: data on ``cpu``, SFT on ``gpu-train``, rollouts and evaluation
on ``gpu-infer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger

from embodied_r import paths
from embodied_r.interactive.recipe import POOLS, ReasonerRecipe, load, plan
from embodied_r.io import is_complete, read_summary
from embodied_r.pipeline import StagePlan
from embodied_r.tracking import Tracker, numeric_metrics, tracking_uri
from flows.runner import discard, log_cached_stage, result_storage, scoped_env
from tasks.stages import _stage_task

STAGE_TASK = _stage_task.with_options(name="reasoner-stage", retries=1, retry_delay_seconds=10)


def _selected(stages: dict[str, dict[str, Any]], only: list[str] | None) -> list[str]:
    names = [n for n in stages if not only or n in only or stages[n]["kind"] in only
             or n.removeprefix("reasoner_") in only]
    for name in names:
        missing = [d for d in stages[name]["deps"] if d not in names and not is_complete(Path(stages[d]["out"]))]
        if missing:
            raise ValueError(f"stage {name} reads {', '.join(missing)}, which has not run with this recipe")
    return names


def run_reasoner(recipe: ReasonerRecipe, root: Path, only: list[str] | None = None,
                 refresh: list[str] | None = None, parent_run_id: str | None = None) -> dict[str, Any]:
    stages = plan(recipe, root)
    selected = _selected(stages, only)
    hit = {n for n in stages if refresh and (n in refresh or n.removeprefix("reasoner_") in refresh)}
    for sp in stages.values():  # what reads a refreshed stage is refreshed too
        if hit & set(sp["deps"]):
            hit.add(sp["name"])
    for name in hit:
        discard(Path(stages[name]["out"]))
    uri = tracking_uri(recipe.tracking_uri, root)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        tracker = Tracker.open(recipe.experiment, uri, root)
        if parent_run_id:
            tracker = Tracker(tracker.uri, tracker.experiment_id, parent_run_id)
        else:
            tracker = tracker.start_parent(f"{recipe.name}-{'-'.join(only) if only else 'pipeline'}",
                                           {"recipe": recipe.name, "pipeline": "embodied-reasoner"},
                                           {"recipe": recipe.model_dump(mode="json")})
        storage = result_storage(root)
        try:
            for name in selected:
                sp = StagePlan.from_dict(stages[name])
                task = STAGE_TASK.with_options(name=name, result_storage=storage,
                                               refresh_cache=name in hit or not sp.complete)
                state = task(sp.to_dict(), tracker, return_state=True)
                result = state.result()
                if state.name == "Cached":
                    log_cached_stage(tracker, sp, result["summary"])
                get_run_logger().info("%s: %s", name, sp.out)
        except BaseException:
            if not parent_run_id:
                tracker.finish(tracker.parent_run_id, "FAILED")
            raise
        final = read_summary(Path(stages["reasoner_evaluate"]["out"])) \
            if is_complete(Path(stages["reasoner_evaluate"]["out"])) else {}
        if not parent_run_id:
            # success/efficiency/completeness overall, per group and per task type.
            tracker.log_metrics(tracker.parent_run_id, {k.removeprefix("metrics/"): v for k, v in
                                                        numeric_metrics(final).items() if k.startswith("metrics/")})
            tracker.finish(tracker.parent_run_id)
    return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri, "stages": {n: stages[n]["out"] for n in selected},
            "evaluation": final}


@flow(name="embodied-reasoner-stage", log_prints=True)
def reasoner_stage(stages: list[str], recipe: str = "reasoner-demo", refresh: bool = False,
                   overrides: dict[str, Any] | None = None, home: str | None = None,
                   mlflow_parent_run_id: str | None = None) -> dict[str, Any]:
    """Named stages alone (their inputs must exist), as a pool's deployment runs them, or a
    rerun by hand; ``refresh`` recomputes them and discards what reads them."""
    root = Path(home).expanduser().resolve() if home else paths.home()
    return run_reasoner(load(recipe, overrides), root, only=stages, refresh=stages if refresh else None,
                        parent_run_id=mlflow_parent_run_id)


@flow(name="embodied-reasoner", log_prints=True)
def embodied_reasoner(recipe: str = "reasoner-demo", only: list[str] | None = None,
                      refresh: list[str] | None = None, overrides: dict[str, Any] | None = None,
                      home: str | None = None, dispatch: Literal["local", "pools"] = "local") -> dict[str, Any]:
    """The whole Embodied-Reasoner pipeline (see the module doc)."""
    root = Path(home).expanduser().resolve() if home else paths.home()
    rec = load(recipe, overrides)
    if dispatch == "local":
        return run_reasoner(rec, root, only=only, refresh=refresh)
    from prefect.deployments import run_deployment

    uri = tracking_uri(rec.tracking_uri, root)
    with scoped_env(MLFLOW_TRACKING_URI=uri):
        tracker = Tracker.open(rec.experiment, uri, root).start_parent(
            f"{rec.name}-pipeline", {"recipe": rec.name, "pipeline": "embodied-reasoner"}, {"recipe": rec.model_dump()})
    order = []
    for name, sp in plan(rec, root).items():
        kind = sp["kind"]
        child = run_deployment(f"embodied-reasoner-stage/{kind.removeprefix('reasoner_')}", timeout=None,
                               parameters={"stages": [name], "recipe": recipe, "overrides": overrides,
                                           "home": str(root), "mlflow_parent_run_id": tracker.parent_run_id})
        if child.state is None or not child.state.is_completed():
            tracker.finish(tracker.parent_run_id, "FAILED")
            raise RuntimeError(f"{name} on pool {POOLS[kind]} did not complete")
        order.append(name)
    tracker.finish(tracker.parent_run_id)
    return {"mlflow_run_id": tracker.parent_run_id, "dispatched": order}
