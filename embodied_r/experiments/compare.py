"""An experiment's figures from its finished runs, as pure functions: each variant per seed and
evaluation set, the mean over seeds with Student's t interval (how much the figure moves with the
seed), and every variant paired against the baseline on the same questions, per seed and pooled."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from embodied_r.evaluation.learning import failure_signatures
from embodied_r.scoring.metrics import format_accuracy
from embodied_r.scoring.paired import PairedResult, format_paired, paired_test

IN_DISTRIBUTION = "test"  # the recipe's own test split
# Two-sided 95 % quantiles of Student's t by degrees of freedom; the normal's beyond.
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


@dataclass
class Cell:
    variant: str
    seed: int | None
    evaluation: str
    accuracy: float
    interval: tuple[float, float] | None
    scores: dict[str, float]  # question uid -> score
    figures: dict[str, float] = field(default_factory=dict)  # the experiment's measures
    run_id: str = ""  # the MLflow parent run of the variant's pipeline (or SFT baseline)


def t95(df: int) -> float:
    if df <= 0:
        return math.nan
    known = [d for d in _T95 if d <= df]
    return _T95[max(known)] if df <= 30 else 1.96


def mean_interval(values: Sequence[float], share: bool = False) -> tuple[float, tuple[float, float] | None]:
    """The mean and its 95 % t-interval over seeds (none from one seed); a ``share`` cannot leave
    [0, 1], and with three seeds the t-interval often would: it is cut there."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t95(n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    return mean, (max(low, 0.0), min(high, 1.0)) if share else (low, high)


def _pairs(base: Cell, other: Cell) -> tuple[list[float], list[float]]:
    """The scores of the questions both answered: all of them on the same split (a failed
    answer scores 0)."""
    both = [u for u in base.scores if u in other.scores]
    return [base.scores[u] for u in both], [other.scores[u] for u in both]


def paired(base: Cell, other: Cell) -> PairedResult:
    return paired_test(*_pairs(base, other))


def pooled(bases: Sequence[Cell], others: Sequence[Cell]) -> PairedResult:
    """Every seed's questions as pairs of one test: whether the variant differs across the seeds run."""
    by_seed = {c.seed: c for c in bases}
    a: list[float] = []
    b: list[float] = []
    for cell in others:
        if (base := by_seed.get(cell.seed)) is not None:
            mine, theirs = _pairs(base, cell)
            a, b = a + mine, b + theirs
    return paired_test(a, b)


@dataclass
class Comparison:
    evaluation: str
    variant: str
    by_seed: dict[Any, PairedResult]
    pooled: PairedResult


def compare(cells: Sequence[Cell], baseline: str) -> list[Comparison]:
    out = []
    for evaluation in dict.fromkeys(c.evaluation for c in cells):
        here = [c for c in cells if c.evaluation == evaluation]
        bases = [c for c in here if c.variant == baseline]
        if not bases:
            continue
        base_of = {c.seed: c for c in bases}
        for variant in dict.fromkeys(c.variant for c in here if c.variant != baseline):
            mine = [c for c in here if c.variant == variant and c.seed in base_of]
            if mine:
                out.append(Comparison(evaluation, variant, {c.seed: paired(base_of[c.seed], c) for c in mine},
                                      pooled(bases, mine)))
    return out


def _fmt(value: float | None, interval: tuple[float, float] | None = None, percent: bool = True) -> str:
    """A figure, with its interval unless the figure is the same at every seed (chance)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if percent:
        same = interval is not None and f"{interval[0]:.3f}" == f"{interval[1]:.3f}"
        return format_accuracy(value, None if same else interval)
    def num(v: float) -> str:
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"

    spread = interval is not None and num(interval[0]) != num(interval[1])
    return num(value) + (f" [{num(interval[0])}, {num(interval[1])}]" if spread else "")


def is_share(name: str) -> bool:
    return name.startswith(("accuracy", "consistency/ratio")) or name.endswith(("ratio", "share", "chance"))


def chance_of(metrics: Mapping[str, Any]) -> float | None:
    """What a uniform guess scores on an evaluation's questions (``metrics.json``): each task's
    chance weighted by its questions, a task without options at 0; None without chance levels."""
    if "chance" not in metrics:
        return None
    levels = metrics["chance"] or {}
    counted = [(c["count"], float(levels.get(c["category"]) or 0.0)) for c in metrics.get("categories") or []]
    total = sum(n for n, _ in counted)
    return sum(n * level for n, level in counted) / total if total else None


def table(cells: Sequence[Cell], measures: Sequence[str] = ()) -> list[str]:
    """Variant x seed and the mean over seeds, per evaluation set."""
    lines: list[str] = []
    for evaluation in dict.fromkeys(c.evaluation for c in cells):
        here = [c for c in cells if c.evaluation == evaluation]
        names = [m for m in measures if any(m in c.figures for c in here)]
        head = f"  {'variant':18s} {'seed':>5s}  {'accuracy [95 % interval]':28s}" + "".join(
            f"  {m:>24s}" for m in names)
        where = "in distribution (the recipe's test split)" if evaluation == IN_DISTRIBUTION else \
            f"out of distribution: {evaluation}"
        lines += [f"{where}:", head]
        for variant in dict.fromkeys(c.variant for c in here):
            mine = [c for c in here if c.variant == variant]
            for c in mine:
                lines.append(f"  {variant:18s} {str(c.seed if c.seed is not None else '-'):>5s}  "
                             f"{_fmt(c.accuracy, c.interval):28s}" + "".join(
                                 f"  {_fmt(c.figures.get(m), None, is_share(m)):>24s}" for m in names))
            if len(mine) > 1:
                mean, interval = mean_interval([c.accuracy for c in mine], share=True)
                row = f"  {variant:18s} {'mean':>5s}  {_fmt(mean, interval):28s}"
                for m in names:
                    values = [c.figures[m] for c in mine if isinstance(c.figures.get(m), (int, float))]
                    row += f"  {_fmt(*mean_interval(values, is_share(m)), is_share(m)) if values else '-':>24s}"
                lines.append(row)
    return lines


def comparison_lines(comparisons: Sequence[Comparison], baseline: str) -> list[str]:
    """Per variant and evaluation set, the paired difference against the baseline, pooled and per seed."""
    if not comparisons:
        return []
    lines = [f"Paired against {baseline} on the same questions (McNemar's exact test; interval by paired bootstrap):"]
    for comp in comparisons:
        seeds = "; ".join(f"seed {s}: {format_paired(r)}" for s, r in comp.by_seed.items())
        verdict = "differs" if comp.pooled.significant else "no difference shown"
        lines.append(f"  {comp.variant} ({comp.evaluation}): pooled {format_paired(comp.pooled)}, "
                     f"{comp.pooled.better} better / {comp.pooled.worse} worse of {comp.pooled.n}: {verdict}")
        if len(comp.by_seed) > 1:
            lines.append(f"    {seeds}")
    return lines


def metrics_of(cell: Cell, comparison: Comparison | None) -> dict[str, float]:
    """A variant run's MLflow metrics, with its paired difference against the baseline at its seed."""
    prefix = cell.evaluation
    out = {f"{prefix}/accuracy": cell.accuracy, f"{prefix}/questions": float(len(cell.scores))}
    if cell.interval:
        out[f"{prefix}/accuracy_ci_low"], out[f"{prefix}/accuracy_ci_high"] = cell.interval
    out.update({f"{prefix}/{k}": float(v) for k, v in cell.figures.items() if isinstance(v, (int, float))})
    if comparison is not None and cell.seed in comparison.by_seed:
        out.update(comparison.by_seed[cell.seed].figures(f"{prefix}/paired"))
    return out


def summary_metrics(cells: Sequence[Cell], comparisons: Sequence[Comparison]) -> dict[str, float]:
    """The parent run's metrics: each variant's mean accuracy and pooled paired test."""
    out: dict[str, float] = {}
    for evaluation in dict.fromkeys(c.evaluation for c in cells):
        for variant in dict.fromkeys(c.variant for c in cells):
            values = [c.accuracy for c in cells if c.evaluation == evaluation and c.variant == variant]
            if values:
                mean, interval = mean_interval(values, share=True)
                out[f"{evaluation}/{variant}/accuracy_mean"] = mean
                if interval:
                    out[f"{evaluation}/{variant}/accuracy_mean_ci_low"], \
                        out[f"{evaluation}/{variant}/accuracy_mean_ci_high"] = interval
    for comp in comparisons:
        out.update(comp.pooled.figures(f"{comp.evaluation}/{comp.variant}/paired"))
    return out


def measure_figures(summaries: Mapping[str, Mapping[str, Any]], measures: Sequence[tuple[str, str, str]]
                    ) -> dict[str, float]:
    out = {}
    for name, stage, key in measures:
        value = (summaries.get(stage) or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


OOD_ADVICE = ("it fits the training distribution at the expense of others: fewer epochs, the best validation "
              "checkpoint (evaluation.checkpoint: best_val), or GRPO where SFT was used (overfitting)")


def signatures(cells: Sequence[Cell], comparisons: Sequence[Comparison]) -> list[str]:
    """Failure signatures with their advice: a low judged consistency ratio at a seed, and a variant
    that gains on the baseline in distribution while it loses out of distribution."""
    lines = []
    for cell in cells:
        if "consistency/ratio" in cell.figures:
            where = f"{cell.variant}, seed {cell.seed}, {cell.evaluation}"
            lines += [line.replace("Failure signature, evaluation:", f"Failure signature, {where}:")
                      for line in failure_signatures({"consistency/ratio": cell.figures["consistency/ratio"]})]
    inside = {c.variant: c.pooled for c in comparisons if c.evaluation == IN_DISTRIBUTION}
    for comp in comparisons:
        ours = inside.get(comp.variant)
        if comp.evaluation == IN_DISTRIBUTION or ours is None:
            continue
        if ours.difference > 0 and comp.pooled.difference < 0 and (ours.significant or comp.pooled.significant):
            lines.append(f"Failure signature, {comp.variant}: in distribution {format_paired(ours)} against the "
                         f"baseline, out of distribution ({comp.evaluation}) {format_paired(comp.pooled)}: {OOD_ADVICE}.")
    return lines
