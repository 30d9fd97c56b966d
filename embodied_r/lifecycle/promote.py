"""Registration and promotion of any model or version a user names in a recipe's home: the
``embodied-r promote`` and ``register-model`` commands, and the promotion split's early check."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from embodied_r.errors import StageError
from embodied_r.evaluation.promotion import Promotion, promote_model
from embodied_r.evaluation.registry import CHAMPION
from embodied_r.lifecycle.models import converted_records, store_of, trained_model
from embodied_r.pipeline import Plan


def warm_started_model(recipe: Any, stages: Plan) -> str | None:
    warm = stages.get("warmstart")
    if warm is None:
        return None
    if not warm.complete:
        raise StageError(f"promotion compares the model with the warm-started policy of recipe {recipe.name!r}, "
                         f"which has not been trained: run `embodied-r warmstart --recipe {recipe.name}` first")
    return str(Path(warm.out) / "model")


def register_and_promote(recipe: Any, stages: Plan, folder: Path | None = None, *, version: str | None = None,
                         run_id: str | None = None, split: str = "val", metric: str = "accuracy/overall",
                         alias: str = CHAMPION, tags: dict[str, str] | None = None,
                         known: Mapping[str, Mapping[str, Any]] | None = None) -> Promotion:
    """``promote_model`` on the plan's records, ``folder`` by default its trained model."""
    if version is None:
        folder = Path(folder or trained_model(stages))
    return promote_model(recipe.tracking.registered_model, records=converted_records(stages),
                         cfg=recipe.evaluation_settings(), root=stages.root, store=store_of(recipe, stages),
                         folder=folder, version=version, warm_model=warm_started_model(recipe, stages),
                         split=split, metric=metric, alias=alias, run_id=run_id,
                         experiment=recipe.tracking.experiment, tags={"recipe": recipe.name, **(tags or {})},
                         known=known)


def check_promotion_split(recipe: Any, catalog_summary: dict[str, Any]) -> None:
    """Promotion on a split the catalog left empty would fail only after every stage had run."""
    split = recipe.tracking.promote_split
    if recipe.tracking.promote and catalog_summary.get(f"n_{split}") == 0:
        from embodied_r.errors import RecipeError

        raise RecipeError(
            f"tracking.promote compares models on the {split} split, but the catalog has no {split} questions "
            f"({catalog_summary.get('questions', 0)} in all): give catalog.split.{split} a larger share (or use "
            f"more videos), set tracking.promote_split to another split, or tracking.promote: false")
