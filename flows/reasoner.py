"""The ``embodied-reasoner`` flow: data -> SFT imitation -> exploration (rejection sampling)
-> SFT exploration -> SFT correction -> evaluation, through the one run loop of both pipelines
(``flows.runner.run_plan``): each stage a Prefect task with its own MLflow child run under
one parent run, served from its folder when that is complete. ``only`` reruns chosen stages (their inputs
must exist); ``refresh`` recomputes stages and everything after them.

On the work pools (``dispatch="pools"``) each group of stages is sent to its kind's deployment
of ``embodied-reasoner-stage`` (``stage_kinds``) with the run's plan: data on ``cpu``, SFT on
``gpu-train``, rollouts and evaluation on ``gpu-infer``.
"""

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
