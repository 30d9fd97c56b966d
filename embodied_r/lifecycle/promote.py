"""Register a model and promote it when it beats chance (the low end of its 95 % interval
above it), the warm-started policy and the champion, all evaluated by the same code on the
same split and questions (``evaluation.promotion``), for any model or version the user
names: the ``embodied-r promote`` and ``register-model`` commands. A pipeline run promotes its
own trained reasoner in its ``promote`` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from embodied_r.errors import StageError
from embodied_r.evaluation.promotion import Promotion, promote_model
from embodied_r.evaluation.registry import CHAMPION
from embodied_r.lifecycle.models import converted_records, store_of, trained_model
from embodied_r.pipeline import Plan


def warm_started_model(recipe: Any, stages: Plan) -> str | None:
    """The plan's warm-started model folder; None for a recipe without a warm start."""
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
    """Register ``folder`` (default: the plan's trained model) as a new version, or take
    ``version``, and give it ``alias`` when on ``split`` of the plan's records it beats chance,
    the warm-started policy (recipes with a warm start) and the alias's version."""
    if version is None:
        folder = Path(folder or trained_model(stages))
    return promote_model(recipe.tracking.registered_model, records=converted_records(stages),
                         cfg=recipe.evaluation_settings(), root=stages.root, store=store_of(recipe, stages),
                         folder=folder, version=version, warm_model=warm_started_model(recipe, stages),
                         split=split, metric=metric, alias=alias, run_id=run_id,
                         experiment=recipe.tracking.experiment, tags={"recipe": recipe.name, **(tags or {})},
                         known=known)


def check_promotion_split(recipe: Any, catalog_summary: dict[str, Any]) -> None:
    """Stop a run that promotes on a split its catalog left empty, once the catalog is
    built: promotion would otherwise fail after every stage had run."""
    split = recipe.tracking.promote_split
    if recipe.tracking.promote and catalog_summary.get(f"n_{split}") == 0:
        from embodied_r.errors import RecipeError

        raise RecipeError(
            f"tracking.promote compares models on the {split} split, but the catalog has no {split} questions "
            f"({catalog_summary.get('questions', 0)} in all): give catalog.split.{split} a larger share (or use "
            f"more videos), set tracking.promote_split to another split, or tracking.promote: false")
