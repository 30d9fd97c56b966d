"""The ``embodied-reasoner`` flow: data -> SFT imitation -> exploration -> SFT exploration -> SFT
correction -> evaluation, through ``flows.runner.run_plan`` (``only``, ``refresh``, ``dispatch``)."""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow

from flows.cancel_watch import watch_cancel
from embodied_r.stage_kinds import kind_of
from embodied_r.tracking.record import Recorder
from flows.runner import given_plan, run_deployment_of, run_plan


@flow(name="embodied-reasoner-stage", log_prints=True)
def reasoner_stage(stages: list[str], recipe: str = "reasoner-demo", refresh: bool = False,
                   overrides: dict[str, Any] | None = None, home: str | None = None,
                   mlflow_parent_run_id: str | None = None, plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """Named stages alone (their inputs must exist), as a pool's deployment runs them, or a
    rerun by hand; ``refresh`` recomputes them and discards what reads them."""
    watch_cancel()
    made = given_plan(plan, "embodied-reasoner", recipe, overrides, home)
    return run_plan(made, Recorder(made, kind_of, mlflow_parent_run_id), only=stages, refresh=stages if refresh else None)


@flow(name="embodied-reasoner", log_prints=True)
def embodied_reasoner(recipe: str = "reasoner-demo", only: list[str] | None = None,
                      refresh: list[str] | None = None, overrides: dict[str, Any] | None = None,
                      home: str | None = None, dispatch: Literal["local", "pools"] = "local",
                      plan: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole Embodied-Reasoner pipeline (see the module doc); ``plan``: the run's plan,
    made by whoever started it, else here."""
    watch_cancel()
    stages = given_plan(plan, "embodied-reasoner", recipe, overrides, home)
    record = Recorder(stages, kind_of)
    if dispatch == "local":
        return run_plan(stages, record, only=only, refresh=refresh)
    order: list[str] = []

    def send(kind: str, names: list[str]) -> None:
        run_deployment_of(kind, {"stages": names, "recipe": stages.recipe_name, "plan": stages.to_json(),
                                 "home": str(stages.root), "mlflow_parent_run_id": record.parent_run_id})
        order.extend(names)

    return {**run_plan(stages, record, only=only, refresh=refresh, dispatch=send), "dispatched": order}
