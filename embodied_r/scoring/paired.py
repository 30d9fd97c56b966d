"""Two policies compared on the same questions: the paired difference of their scores, its
95 % interval (paired bootstrap, percentile) and a two-sided p-value (McNemar's exact test for
0/1 scores, else a sign-flip test). Pairing keeps only what differs, so a gain of a few points
can be told from noise where unpaired intervals overlap; ``seed`` fixes the resampling."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

RESAMPLES = 10_000
ALPHA = 0.05


@dataclass(frozen=True)
class PairedResult:
    n: int  # questions both policies answered (a failed answer is there, scoring 0)
    difference: float  # mean of (other - base)
    ci_low: float
    ci_high: float
    p_value: float
    method: str  # "mcnemar_exact" | "sign_flip"
    better: int  # questions only ``other`` scored higher on
    worse: int  # questions only ``base`` scored higher on

    @property
    def significant(self) -> bool:
        return self.p_value < ALPHA

    def figures(self, prefix: str) -> dict[str, float]:
        raw = asdict(self)
        raw.pop("method")
        return {f"{prefix}/{k}": float(v) for k, v in raw.items()}

    @classmethod
    def from_figures(cls, figures: Mapping[str, Any], prefix: str) -> "PairedResult | None":
        """None when the figures are not all there."""
        names = ("n", "difference", "ci_low", "ci_high", "p_value", "better", "worse")
        values = [figures.get(f"{prefix}/{k}") for k in names]
        if not all(isinstance(v, (int, float)) for v in values):
            return None
        n, diff, low, high, p, better, worse = values
        return cls(int(n), float(diff), float(low), float(high), float(p), "", int(better), int(worse))


def _binomial_two_sided(k: int, n: int) -> float:
    """The exact McNemar p-value: P(X <= min(k, n-k)) doubled, X ~ Binomial(n, 1/2)."""
    if n == 0:
        return 1.0
    low = min(k, n - k)
    # In log space: n reaches thousands and 2**-n underflows.
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2)
            for i in range(low + 1)]
    top = max(logs)
    tail = math.exp(top) * sum(math.exp(x - top) for x in logs)
    return min(1.0, 2.0 * tail)


def _chunked(total: int, n: int, draw) -> np.ndarray:
    # A (resamples x questions) matrix at once is gigabytes for thousands of questions.
    step = max(1, 2_000_000 // n)
    return np.concatenate([draw(min(step, total - i)) for i in range(0, total, step)])


def paired_test(base: Sequence[float], other: Sequence[float], *, resamples: int = RESAMPLES,
                seed: int = 0) -> PairedResult:
    """``base[i]`` and ``other[i]`` score the same question."""
    a, b = np.asarray(base, dtype=float), np.asarray(other, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired scores need the same questions: {a.shape} against {b.shape}")
    n = int(a.size)
    if n == 0:
        raise ValueError("paired test of no questions")
    diff = b - a
    better, worse = int((diff > 0).sum()), int((diff < 0).sum())
    rng = np.random.default_rng(seed)
    if not (better or worse):
        return PairedResult(n, 0.0, 0.0, 0.0, 1.0, "mcnemar_exact", 0, 0)
    binary = bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    if binary:
        p, method = _binomial_two_sided(better, better + worse), "mcnemar_exact"
    else:
        observed = abs(diff.mean())
        flipped = _chunked(resamples, n, lambda k: (rng.choice((-1.0, 1.0), size=(k, n)) * diff).mean(axis=1))
        extreme = int((np.abs(flipped) >= observed - 1e-12).sum())
        p, method = (extreme + 1) / (resamples + 1), "sign_flip"
    means = _chunked(resamples, n, lambda k: diff[rng.integers(0, n, size=(k, n))].mean(axis=1))
    low, high = np.quantile(means, [ALPHA / 2, 1 - ALPHA / 2])
    return PairedResult(n, float(diff.mean()), float(low), float(high), float(p), method, better, worse)


def format_p(p_value: float) -> str:
    """``p = 0.0004``, or ``p < 0.0001`` below what four decimals show."""
    return "p < 0.0001" if p_value < 1e-4 else f"p = {p_value:.4f}"


def format_paired(result: PairedResult) -> str:
    """``+6.9 points [3.1, 10.6], p = 0.0004``."""
    return (f"{100 * result.difference:+.1f} points [{100 * result.ci_low:.1f}, {100 * result.ci_high:.1f}], "
            f"{format_p(result.p_value)}")
