"""Register a recipe's trained reasoner and promote it when it beats the champion, both
sides evaluated by the same code on the same split."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from embodied_r.lifecycle.models import evaluate_model, trained_model
from embodied_r.evaluation.registry import CHAMPION, Promotion, promote_if_better, register_model_folder
from embodied_r.tracking import tracking_uri


def register_and_promote(recipe: Any, root: Path, folder: Path | None = None, *, version: str | None = None,
                         run_id: str | None = None, split: str = "val", metric: str = "accuracy/overall",
                         alias: str = CHAMPION, tags: dict[str, str] | None = None) -> Promotion:
    """Register ``folder`` (default: the recipe's trained model) as a new version, or take
    ``version``, and give it ``alias`` when it beats the alias's version on ``split`` of
    the recipe's records. Both are evaluated by ``apps.models.evaluate_model``."""
    store = tracking_uri(recipe.tracking.tracking_uri, root)
    name = recipe.tracking.registered_model
    if version is None:
        folder = Path(folder or trained_model(recipe, root))
        version = str(register_model_folder(folder, name, tracking_uri=store, run_id=run_id,
                                            experiment=recipe.tracking.experiment,
                                            tags={"recipe": recipe.name, **(tags or {})}).version)

    sets: list[tuple[str, Path, Any]] = []

    def score(uri: str) -> float:
        out, summary = evaluate_model(recipe, uri, split, root)
        if metric not in summary:
            raise ValueError(f"metric {metric!r} is not in the evaluation summary ({out}); "
                             "use accuracy/overall, accuracy/macro or accuracy/<task>")
        # Scores on different questions (one side lost calls) are not comparable: refuse
        # before the alias can move.
        sets.append((uri, out, summary.get("question_set")))
        if len({s for _, _, s in sets}) > 1:
            raise ValueError("promotion refused: the models were scored on different question sets ("
                             + "; ".join(f"{u}: {o}" for u, o, _ in sets)
                             + "); see failures.parquet in each folder, remove the one with failed questions "
                             "and promote again so both answer the same questions")
        return float(summary[metric])

    return replace(promote_if_better(name, version, score, alias=alias, metric=metric, tracking_uri=store),
                   split=split)
