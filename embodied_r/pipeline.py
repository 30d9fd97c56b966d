"""A recipe's plan (a loop over its pipeline's stage kinds' declarations) and running one stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embodied_r.config import recipe_pipeline
from embodied_r.paths import home as default_home
from embodied_r.code_keys import runner
from embodied_r.stage_kinds import kind_of, kinds
from embodied_r.stage_plan import Plan, StagePlan, plan_stages

__all__ = ["Plan", "StagePlan", "execute", "plan", "training_stage_names"]


def plan(recipe: Any, root: Path | None = None) -> Plan:
    """Every stage of the recipe's pipeline in run order, from the model that pipeline starts from."""
    pipeline = recipe_pipeline(recipe)
    start = recipe.training.policy if pipeline == "embodied-r" else recipe.base_model
    return plan_stages(kinds(pipeline), recipe, Path(root) if root else default_home(), start)


def training_stage_names(stages: dict[str, StagePlan]) -> list[str]:
    return [n for n, sp in stages.items() if sp.kind == "train"]


def execute(sp: StagePlan, mlflow_run_id: str | None = None) -> dict[str, Any]:
    """Run one stage (a no-op returning its summary when its folder is complete)."""
    return runner(kind_of(sp.kind).runner)(Path(sp.out), sp.config, sp.inputs, mlflow_run_id)
