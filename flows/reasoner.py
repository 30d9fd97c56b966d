"""The ``embodied-reasoner`` flow: data -> SFT imitation -> exploration (rejection sampling)
-> SFT exploration -> SFT correction -> evaluation, through the same loop as Embodied-R's
(``flows.runner.run_stages``): each stage a Prefect task with its own MLflow child run under
one parent run, served from its folder when that is complete. ``only`` reruns chosen stages (their inputs
must exist); ``refresh`` recomputes stages and everything after them.

On the work pools (``dispatch="pools"``) each group of stages is sent to its kind's deployment
of ``embodied-reasoner-stage`` (``stage_kinds``): data on ``cpu``, SFT on ``gpu-train``,
rollouts and evaluation on ``gpu-infer``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from prefect import flow

from embodied_r import paths
from embodied_r.interactive.recipe import ReasonerRecipe, load, plan
from embodied_r.io import is_complete, read_summary
from embodied_r.pipeline import StagePlan
from embodied_r.stage_plan import downstream
from embodied_r.tracking import Tracker, numeric_metrics, tracking_uri
from flows.runner import Dispatch, discard, run_deployment_of, run_stages, scoped_env


def _named(stages: dict[str, StagePlan], names: list[str] | None) -> list[str]:
    """Stages by name, kind or name without its ``reasoner_`` prefix (``sft`` is all three)."""
    return [n for n in stages if names and (n in names or stages[n].kind in names
                                            or n.removeprefix("reasoner_") in names)]


def _selected(stages: dict[str, StagePlan], only: list[str] | None) -> list[str]:
    names = _named(stages, only) if only else list(stages)
    for name in names:
        missing = [d for d in stages[name].deps if d not in names and not stages[d].complete]
        if missing:
            raise ValueError(f"stage {name} reads {', '.join(missing)}, which has not run with this recipe")
    return names


def run_reasoner(recipe: ReasonerRecipe, root: Path, only: list[str] | None = None,
                 refresh: list[str] | None = None, parent_run_id: str | None = None,
                 dispatch: Dispatch | None = None) -> dict[str, Any]:
    """The selected stages through the shared loop (``flows.runner.run_stages``), here or, with
    ``dispatch``, on the pools; a refreshed stage is recomputed with what reads it."""
    stages = plan(recipe, root)
    selected = _selected(stages, only)
    for name in downstream(stages, _named(stages, refresh)):
        discard(Path(stages[name].out))
    uri = tracking_uri(recipe.tracking_uri, root)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        tracker = Tracker.open(recipe.experiment, uri, root)
        if parent_run_id:
            tracker = Tracker(tracker.uri, tracker.experiment_id, parent_run_id)
        else:
            tracker = tracker.start_parent(f"{recipe.name}-{'-'.join(only) if only else 'pipeline'}",
                                           {"recipe": recipe.name, "pipeline": "embodied-reasoner"},
                                           {"recipe": recipe.model_dump(mode="json")})
        try:
            cached = run_stages(stages, selected, tracker, dispatch=dispatch)
        except BaseException:
            if not parent_run_id:
                tracker.finish(tracker.parent_run_id, "FAILED")
            raise
        evaluate = Path(stages["reasoner_evaluate"].out)
        final = read_summary(evaluate) if is_complete(evaluate) else {}
        if not parent_run_id:
            # success/efficiency/completeness overall, per group and per task type.
            tracker.log_metrics(tracker.parent_run_id, {k.removeprefix("metrics/"): v for k, v in
                                                        numeric_metrics(final).items() if k.startswith("metrics/")})
            tracker.finish(tracker.parent_run_id)
    return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri, "cached": cached,
            "stages": {n: stages[n].out for n in selected}, "evaluation": final}


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
    order: list[str] = []

    def send(kind: str, names: list[str], parent_run_id: str) -> None:
        run_deployment_of(kind, {"stages": names, "recipe": recipe, "overrides": overrides, "home": str(root),
                                 "mlflow_parent_run_id": parent_run_id})
        order.extend(names)

    result = run_reasoner(rec, root, only=only, refresh=refresh, dispatch=send)
    return {**result, "dispatched": order}
