"""Register a recipe's trained reasoner and promote it when it beats chance (the low end of its
95 % interval above it), the warm-started policy and the champion, all evaluated by the same code on the same split and questions.
The registered version's description gives its scores on that split and the test split
beside chance."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from embodied_r.evaluation.promotion import Bar, Promotion, promote_if_better, set_description
from embodied_r.evaluation.registry import CHAMPION, ModelRef, register_model_folder
from embodied_r.evaluation.stage import read_split
from embodied_r.lifecycle.models import converted_records, evaluate_model, trained_model
from embodied_r.pipeline import StageError, plan
from embodied_r.scoring.metrics import chance_metrics, format_accuracy, summary_interval
from embodied_r.tracking import tracking_uri

WARM_STARTED = "the warm-started policy's"


def warm_started_model(recipe: Any, root: Path) -> str | None:
    """The recipe's warm-started model folder; None for a recipe without a warm start."""
    if recipe.warmstart is None:
        return None
    warm = plan(recipe, root)["warmstart"]
    if not warm.complete:
        raise StageError(f"promotion compares the model with the warm-started policy of recipe {recipe.name!r}, "
                         f"which has not been trained: run `embodied-r warmstart --recipe {recipe.name}` first")
    return str(Path(warm.out) / "model")


@dataclass(frozen=True)
class SplitScore:
    """A model's score on one split, beside chance (and other bars) on the same questions."""

    split: str
    score: float
    count: int
    interval: tuple[float, float] | None
    chance: float
    others: tuple[Bar, ...] = ()


def version_description(metric: str, scores: Sequence[SplitScore], promotion: str) -> str:
    """A registered version's description: its ``metric`` on each split with the 95 % interval
    and question count, beside chance and the other bars, then the promotion's outcome."""
    lines = []
    for s in scores:
        beside = ", ".join(b.describe() for b in (Bar("chance", s.chance), *s.others))
        lines.append(f"- {metric} on the {s.split} split ({s.count} questions): "
                     f"{format_accuracy(s.score, s.interval)}; {beside}")
    return "\n".join(lines + ["", promotion])


def register_and_promote(recipe: Any, root: Path, folder: Path | None = None, *, version: str | None = None,
                         run_id: str | None = None, split: str = "val", metric: str = "accuracy/overall",
                         alias: str = CHAMPION, tags: dict[str, str] | None = None,
                         known: Mapping[str, Mapping[str, Any]] | None = None) -> Promotion:
    """Register ``folder`` (default: the recipe's trained model) as a new version, or take
    ``version``, and give it ``alias`` when on ``split`` of the recipe's records it beats
    chance, the warm-started policy (recipes with a warm start) and the alias's version.
    All are evaluated by ``lifecycle.models.evaluate_model``. ``known``: summaries of this
    model's evaluations already made, by split (the pipeline's own test evaluation), so
    the description's test score is not computed twice."""
    store = tracking_uri(recipe.tracking.tracking_uri, root)
    name = recipe.tracking.registered_model
    if version is None:
        folder = Path(folder or trained_model(recipe, root))
        version = str(register_model_folder(folder, name, tracking_uri=store, run_id=run_id,
                                            experiment=recipe.tracking.experiment,
                                            tags={"recipe": recipe.name, **(tags or {})}).version)
    candidate = ModelRef(name, version=str(version)).uri
    records = converted_records(recipe, root)

    sets: list[tuple[str, Path, Any]] = []
    summaries: dict[str, Mapping[str, Any]] = {}

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
        summaries[uri] = summary
        return float(summary[metric])

    # Chance is beaten only by the low end of the candidate's 95 % interval.
    bars = [Bar("chance", chance_metrics(read_split(records, split)).get(metric, 0.0), by_low_end=True)]
    warm = warm_started_model(recipe, root)
    if warm is not None:
        # Through ``score``: the same split, config and question-set check as the candidate.
        bars.append(Bar(WARM_STARTED, score(warm)))
    result = promote_if_better(name, version, score, alias=alias, metric=metric, tracking_uri=store, bars=bars,
                               interval=lambda uri: summary_interval(summaries[uri], metric))
    result = replace(result, split=split)

    scores = [_split_score(summaries[candidate], split, metric, records, tuple(bars[1:]))]
    for other in [s for s in ("val", "test") if s != split and read_split(records, s)]:
        summary = (known or {}).get(other) or evaluate_model(recipe, candidate, other, root)[1]
        if metric in summary:
            scores.append(_split_score(summary, other, metric, records))
    set_description(name, version, version_description(metric, scores, result.describe()), store)
    return result


def _split_score(summary: Mapping[str, Any], split: str, metric: str, records: Path,
                 others: tuple[Bar, ...] = ()) -> SplitScore:
    count = summary.get("count" + metric[len("accuracy"):], summary.get("count/overall", 0))
    return SplitScore(split, float(summary[metric]), int(count or 0), summary_interval(summary, metric),
                      chance_metrics(read_split(records, split)).get(metric, 0.0), others)


def check_promotion_split(recipe: Any, catalog_summary: dict[str, Any]) -> None:
    """Stop a run that promotes on a split its catalog left empty, once the catalog is
    built: promotion would otherwise fail after every stage had run."""
    split = recipe.tracking.promote_split
    if recipe.tracking.promote and catalog_summary.get(f"n_{split}") == 0:
        from embodied_r.config import RecipeError

        raise RecipeError(
            f"tracking.promote compares models on the {split} split, but the catalog has no {split} questions "
            f"({catalog_summary.get('questions', 0)} in all): give catalog.split.{split} a larger share (or use "
            f"more videos), set tracking.promote_split to another split, or tracking.promote: false")
