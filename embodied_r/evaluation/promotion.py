"""Promotion: a registered version takes an alias (``@champion``) only when it beats every bar
(chance, the warm-started policy) and the alias's version, all scored by the same code on the
same questions; and the pipeline's ``promote`` stage."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.evaluation.models import evaluate_model
from embodied_r.evaluation.registry import (CHAMPION, ModelRef, alias_version, client, register_model_folder,
                                            set_alias, version_of_folder)
from embodied_r.evaluation.stage import read_split
from embodied_r.io import is_complete, read_summary, stage_folder, write_summary
from embodied_r.scoring.metrics import chance_metrics, format_accuracy, summary_interval

WARM_STARTED = "the warm-started policy's"


@dataclass(frozen=True)
class Bar:
    """A score a candidate must beat to take the alias at all, however the champion scores. With
    ``by_low_end`` only the low end of its 95 % interval beats it (chance: a score within a
    guesser's reach is no evidence)."""

    label: str  # as it reads before the score: "chance", "the warm-started policy's"
    score: float
    by_low_end: bool = False

    def describe(self) -> str:
        return f"{self.label} {100 * self.score:.1f} %"


@dataclass
class Promotion:
    name: str
    alias: str
    metric: str
    candidate_version: str
    candidate_score: float
    champion_version: str | None
    champion_score: float | None
    promoted: bool
    # Named in the verdict: the pipeline prints its test accuracy just before, and a bare score
    # reads as that one.
    split: str = ""
    bars: list[Bar] = field(default_factory=list)
    interval: tuple[float, float] | None = None

    def _beats(self, bar: Bar) -> bool:
        if bar.by_low_end:
            return self.interval is not None and self.interval[0] > bar.score
        return self.candidate_score > bar.score

    @property
    def short_of(self) -> list[Bar]:
        return [b for b in self.bars if not self._beats(b)]

    def _score(self) -> str:
        return format_accuracy(self.candidate_score, self.interval)

    def describe(self) -> str:
        if self.short_of:
            on = f"{self.split} {self.metric}" if self.split else self.metric
            plain = [b for b in self.short_of if not (b.by_low_end and self.candidate_score > b.score)]
            low_end = [b for b in self.short_of if b not in plain]
            why = [f"is not above {' / '.join(b.describe() for b in plain)}"] if plain else []
            if low_end:
                low = "unknown" if self.interval is None else f"{100 * self.interval[0]:.1f} %"
                why.append(f"the low end of its 95 % interval ({low}) is not above "
                           f"{' / '.join(b.describe() for b in low_end)}")
            return (f"{self.name} v{self.candidate_version} not promoted to @{self.alias}: {on} {self._score()}"
                    + ("" if plain else ";") + " " + "; ".join(why))
        against = ("no current champion" if self.champion_version is None else
                   f"champion v{self.champion_version} scores {100 * self.champion_score:.1f} %"
                   if self.champion_score is not None else f"champion v{self.champion_version}")
        verdict = "promoted" if self.promoted else "not promoted"
        on = f"{self.metric} of the {self.split} split" if self.split else self.metric
        above = f", above {' and '.join(b.describe() for b in self.bars)}" if self.bars else ""
        return (f"{self.name} v{self.candidate_version} scores {self._score()} on {on}{above} "
                f"({against}): {verdict} to @{self.alias}")


def promote_if_better(name: str, candidate_version: str | int, score: Callable[[str], float], *,
                      alias: str = CHAMPION, metric: str = "accuracy/overall", tracking_uri: str | None = None,
                      bars: Sequence[Bar] = (),
                      interval: Callable[[str], tuple[float, float] | None] | None = None) -> Promotion:
    """Give ``alias`` to the candidate when it scores strictly above every bar and the alias's
    version (or the alias is unset); short of a bar, the champion is not scored. ``score(uri)``
    evaluates an immutable ``models:/name/<version>``, each score kept as a version tag;
    ``interval(uri)``: its 95 % interval, for the bars judged by the low end."""
    c = client(tracking_uri)
    candidate = str(candidate_version)
    current = alias_version(name, alias, tracking_uri)
    cand_score = float(score(ModelRef(name, version=candidate).uri))
    c.set_model_version_tag(name, candidate, f"score/{metric}", json.dumps(cand_score))
    champ_version = None if current is None else str(current.version)
    result = Promotion(name, alias, metric, candidate, cand_score, champ_version, None, False, bars=list(bars),
                       interval=interval(ModelRef(name, version=candidate).uri) if interval else None)
    if result.short_of:
        return result
    champ_score = None
    if champ_version is not None and champ_version != candidate:
        champ_score = float(score(ModelRef(name, version=champ_version).uri))
        c.set_model_version_tag(name, champ_version, f"score/{metric}", json.dumps(champ_score))
    elif champ_version == candidate:
        champ_score = cand_score
    promoted = champ_version is None or (champ_version != candidate and champ_score is not None
                                         and cand_score > champ_score)
    if promoted:
        set_alias(name, alias, candidate, tracking_uri)
    return replace(result, champion_score=champ_score, promoted=promoted)


@dataclass(frozen=True)
class SplitScore:
    split: str
    score: float
    count: int
    interval: tuple[float, float] | None
    chance: float
    others: tuple[Bar, ...] = ()


def version_description(metric: str, scores: Sequence[SplitScore], promotion: str) -> str:
    """Its ``metric`` on each split beside chance and the other bars, then the promotion's outcome."""
    lines = []
    for s in scores:
        beside = ", ".join(b.describe() for b in (Bar("chance", s.chance), *s.others))
        lines.append(f"- {metric} on the {s.split} split ({s.count} questions): "
                     f"{format_accuracy(s.score, s.interval)}; {beside}")
    return "\n".join(lines + ["", promotion])


def _split_score(summary: Mapping[str, Any], split: str, metric: str, records: Path,
                 others: tuple[Bar, ...] = ()) -> SplitScore:
    count = summary.get("count" + metric[len("accuracy"):], summary.get("count/overall", 0))
    return SplitScore(split, float(summary[metric]), int(count or 0), summary_interval(summary, metric),
                      chance_metrics(read_split(records, split)).get(metric, 0.0), others)


def promote_model(name: str, *, records: Path, cfg: EvaluationConfig, root: Path, store: str,
                  folder: Path | None = None, version: str | None = None, warm_model: str | None = None,
                  split: str = "val", metric: str = "accuracy/overall", alias: str = CHAMPION,
                  run_id: str | None = None, experiment: str = "embodied-r", tags: dict[str, str] | None = None,
                  known: Mapping[str, Mapping[str, Any]] | None = None) -> Promotion:
    """Register ``folder`` (or take ``version``) and promote it on ``split``. ``known``: summaries
    already made by split (the pipeline's test evaluation), not computed twice."""
    if version is None:
        version = str(register_model_folder(Path(folder), name, tracking_uri=store, run_id=run_id,
                                            experiment=experiment, tags=tags).version)
    candidate = ModelRef(name, version=str(version)).uri
    sets: list[tuple[str, Path, Any]] = []
    summaries: dict[str, Mapping[str, Any]] = {}

    def evaluate(uri: str, on: str) -> tuple[Path, dict[str, Any]]:
        return evaluate_model(uri, on, records=records, cfg=cfg, root=root, store=store)

    def score(uri: str) -> float:
        out, summary = evaluate(uri, split)
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

    bars = [Bar("chance", chance_metrics(read_split(records, split)).get(metric, 0.0), by_low_end=True)]
    if warm_model is not None:
        # Through ``score``: the same split, config and question-set check as the candidate.
        bars.append(Bar(WARM_STARTED, score(warm_model)))
    result = promote_if_better(name, version, score, alias=alias, metric=metric, tracking_uri=store, bars=bars,
                               interval=lambda uri: summary_interval(summaries[uri], metric))
    result = replace(result, split=split)
    scores = [_split_score(summaries[candidate], split, metric, records, tuple(bars[1:]))]
    for other in [s for s in ("val", "test") if s != split and read_split(records, s)]:
        summary = (known or {}).get(other) or evaluate(candidate, other)[1]
        if metric in summary:
            scores.append(_split_score(summary, other, metric, records))
    description = version_description(metric, scores, result.describe())
    client(store).update_model_version(name, str(version), description=description)
    return result


def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    """Register the trained model once, under the pipeline's MLflow run, and promote it."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    name, store, folder = config["registered_model"], config["store"], Path(inputs["model"])
    with stage_folder(out) as work:
        known = version_of_folder(name, folder, store)
        if known is not None:
            summary = {"registered_version": str(known.version), "promoted": False,
                       "description": f"{name} v{known.version} is this model (registered before)"}
        else:
            final = read_summary(Path(inputs["evaluation"]))
            parent = _parent_run(store, mlflow_run_id)
            result = promote_model(
                name, records=Path(inputs["records"]), cfg=EvaluationConfig.model_validate(config["evaluation"]),
                root=Path(inputs["home"]), store=store, folder=folder, warm_model=inputs.get("warm_model"),
                split=config["promote_split"], metric=config["promote_metric"], run_id=parent,
                experiment=config["experiment"], tags={"recipe": config["recipe"], "pipeline_run": parent or ""},
                known={str(final["split"]): final} if final.get("split") else None)
            summary = {"registered_version": result.candidate_version, "promoted": result.promoted,
                       "score": result.candidate_score, "description": result.describe()}
            if parent:
                client(store).set_tag(parent, "registered_version", result.candidate_version)
                client(store).set_tag(parent, "promoted", str(result.promoted).lower())
        write_summary(work, summary)
    return summary


def _parent_run(store: str, run_id: str | None) -> str | None:
    """The pipeline's MLflow run above the stage's own: the trained model is logged there."""
    if not run_id:
        return None
    return client(store).get_run(run_id).data.tags.get("mlflow.parentRunId") or run_id
