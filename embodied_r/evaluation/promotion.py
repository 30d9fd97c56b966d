"""Promotion: a registered version takes an alias (``@champion``) only when it beats every bar
(chance, the warm-started policy) and the version the alias holds, both scored by the same
code on the same data."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from embodied_r.evaluation.registry import CHAMPION, ModelRef, alias_version, client, set_alias


@dataclass(frozen=True)
class Bar:
    """A score a candidate must beat before it can take the alias at all, however the
    champion scores: chance, and the warm-started policy the training started from. With
    ``by_low_end`` the candidate beats it only when the low end of its 95 % interval does
    (chance: a score within a guesser's reach is no evidence)."""

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
    # The split both sides were scored on: the pipeline prints its test accuracy just before,
    # and a bare score reads as that one.
    split: str = ""
    bars: list[Bar] = field(default_factory=list)
    # The candidate's 95 % interval, when its metric is a share of questions.
    interval: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def _beats(self, bar: Bar) -> bool:
        if bar.by_low_end:
            return self.interval is not None and self.interval[0] > bar.score
        return self.candidate_score > bar.score

    @property
    def short_of(self) -> list[Bar]:
        """The bars the candidate did not beat."""
        return [b for b in self.bars if not self._beats(b)]

    def _score(self) -> str:
        from embodied_r.scoring.metrics import format_accuracy

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


def promote_if_better(
    name: str,
    candidate_version: str | int,
    score: Callable[[str], float],
    *,
    alias: str = CHAMPION,
    metric: str = "accuracy/overall",
    tracking_uri: str | None = None,
    bars: Sequence[Bar] = (),
    interval: Callable[[str], tuple[float, float] | None] | None = None,
) -> Promotion:
    """Give ``alias`` to the candidate when it scores strictly higher than every one of
    ``bars`` and than the version the alias holds now (or the alias is unset). A candidate
    short of a bar is never promoted, and the champion is not scored for it. ``score(uri)``
    evaluates an immutable ``models:/name/<version>`` URI, so both sides are measured by the
    same code on the same data; each version's score is kept as a version tag. ``interval(uri)``:
    the 95 % interval of a scored URI's metric, for the bars judged by its low end."""
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
    if champ_version is None:
        promoted = True
    else:
        promoted = champ_version != candidate and champ_score is not None and cand_score > champ_score
    if promoted:
        set_alias(name, alias, candidate, tracking_uri)
    return replace(result, champion_score=champ_score, promoted=promoted)


def set_description(name: str, version: str | int, text: str, tracking_uri: str | None = None) -> None:
    client(tracking_uri).update_model_version(name, str(version), description=text)
