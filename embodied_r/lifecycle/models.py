"""A run's converted records and trained reasoner, read from its plan, and evaluation of any
model reference on them (``evaluation.models`` does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embodied_r.errors import StageError
from embodied_r.evaluation.models import evaluate_model as evaluate_on_records, resolve_reasoner
from embodied_r.evaluation.registry import CHAMPION_URI
from embodied_r.pipeline import Plan, training_stage_names
from embodied_r.tracking.store import tracking_uri


def trained_model(stages: Plan) -> str:
    """The plan's last trained stage's model folder; raises when it has not been trained."""
    names = training_stage_names(stages)
    last = stages[names[-1]] if names else None
    if last is None or not last.complete:
        name = stages.recipe_name
        raise StageError(
            f"recipe {name!r} has no trained reasoner yet ({last.name if last else 'it trains none'}): pass a "
            f"model (a folder, tiny:lm, {CHAMPION_URI}) or run `embodied-r run --recipe {name}` first")
    return str(Path(last.out) / "model")


def converted_records(stages: Plan) -> Path:
    """The plan's convert-stage folder; raises when it has not been run."""
    convert = stages["convert"]
    if not convert.complete:
        name = stages.recipe_name
        raise StageError(f"no converted records for recipe {name!r}: run `embodied-r convert --recipe "
                         f"{name}` (or the whole pipeline) first")
    return Path(convert.out)


def store_of(recipe: Any, stages: Plan) -> str:
    return tracking_uri(recipe.tracking.tracking_uri, stages.root)


def reasoner_of(ref: str | None, recipe: Any, stages: Plan) -> Any:
    """Where a model reference points (default: the plan's trained model)."""
    return resolve_reasoner(ref or trained_model(stages), store_of(recipe, stages))


def evaluate_model(recipe: Any, ref: str | None, split: str, stages: Plan,
                   out: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Evaluate a model reference (default: the trained one) on ``split`` of the plan's
    records as every evaluation of the reasoner asks it (``Recipe.evaluation_settings``)."""
    ref = ref or trained_model(stages)
    reasoner_of(ref, recipe, stages)  # a model that is not there is said before the records are
    return evaluate_on_records(ref, split, records=converted_records(stages), cfg=recipe.evaluation_settings(),
                               root=stages.root, store=store_of(recipe, stages), out=out)
