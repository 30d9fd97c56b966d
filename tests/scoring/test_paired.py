"""The paired comparison of two policies on the same questions (``scoring.paired``) and the
demo's verdict that rests on it: identical answers differ by nothing; McNemar's exact p-value
by hand; a planted better model is found at the power stated below, where the unpaired
intervals mostly overlap; no difference is found about as often as the level allows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied_r.evaluation.learning import PAIRED, learning_figures, paired_against, verdict_of
from embodied_r.scoring.metrics import accuracy_interval
from embodied_r.scoring.paired import PairedResult, paired_test

N = 572  # the demo's test questions


def test_identical_answers_give_no_difference():
    scores = [1.0, 0.0, 1.0, 1.0, 0.0] * 20
    result = paired_test(scores, list(scores))
    assert (result.difference, result.ci_low, result.ci_high, result.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert not result.significant and (result.better, result.worse) == (0, 0)
    numeric = [0.3, 0.9, 0.55] * 10
    assert paired_test(numeric, numeric).p_value == 1.0


def test_mcnemar_exact_by_hand():
    # 10 questions only the second policy gets right, 2 only the first, 88 both or neither:
    # p = 2 * P(X <= 2), X ~ Binomial(12, 1/2) = 2 * (1 + 12 + 66) / 4096.
    base = [0.0] * 10 + [1.0] * 2 + [1.0] * 50 + [0.0] * 38
    other = [1.0] * 10 + [0.0] * 2 + [1.0] * 50 + [0.0] * 38
    result = paired_test(base, other)
    assert result.method == "mcnemar_exact" and (result.better, result.worse, result.n) == (10, 2, 100)
    assert result.p_value == pytest.approx(2 * 79 / 4096)
    assert result.difference == pytest.approx(0.08) and result.ci_low < 0.08 < result.ci_high
    # Symmetric in which policy is called the base.
    assert paired_test(other, base).p_value == pytest.approx(result.p_value)
    assert paired_test(other, base).difference == pytest.approx(-0.08)
    with pytest.raises(ValueError, match="same questions"):
        paired_test(base, other[:-1])


def _planted(rng: np.random.Generator, gain: float, discordant: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """A starting policy right on about 54 % of N questions, and one that answers alike except
    on ``discordant`` of them, where it is the one right with probability
    (1 + gain / discordant) / 2: its true gain is ``gain``."""
    base = (rng.random(N) < 0.54).astype(float)
    other = base.copy()
    differ = rng.random(N) < discordant
    wins = rng.random(N) < (1 + gain / discordant) / 2
    base[differ], other[differ] = (~wins[differ]).astype(float), wins[differ].astype(float)
    return base, other


def test_a_planted_gain_of_six_points_is_found_at_power_nine_in_ten():
    """Stated power: a true gain of 6 points on the demo's 572 questions, the two policies
    answering differently on 15 % of them, is found (p < 0.05) in at least 90 % of draws
    (McNemar's normal approximation says 96 %); unpaired, the two 95 % intervals overlap in
    most of the same draws."""
    rng = np.random.default_rng(7)
    found = overlapping = 0
    draws = 200
    for i in range(draws):
        base, other = _planted(rng, gain=0.06)
        result = paired_test(base, other, resamples=500, seed=i)
        found += result.significant and result.difference > 0
        lo_b, hi_b = accuracy_interval(base.sum(), N)
        lo_o, hi_o = accuracy_interval(other.sum(), N)
        overlapping += lo_o <= hi_b
    assert found / draws >= 0.9, found
    assert overlapping / draws >= 0.5, overlapping


def test_no_gain_is_found_about_as_often_as_the_level_allows():
    rng = np.random.default_rng(11)
    draws = 300
    false = sum(paired_test(*_planted(rng, gain=0.0), resamples=200, seed=i).significant for i in range(draws))
    assert false / draws <= 0.08, false


def test_numeric_scores_take_the_sign_flip_test():
    rng = np.random.default_rng(3)
    base = rng.random(300)
    better = np.clip(base + rng.normal(0.05, 0.1, 300), 0, 1)
    result = paired_test(base, better, resamples=2000)
    assert result.method == "sign_flip" and result.significant and result.ci_low > 0
    noise = np.clip(base + rng.normal(0.0, 0.1, 300), 0, 1)
    assert not paired_test(base, noise, resamples=2000).significant or abs(noise.mean() - base.mean()) > 0.01


def _predictions(folder, scores: dict[str, float]) -> None:
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"uid": list(scores), "score": list(scores.values())}), folder / "predictions.parquet")


def test_the_verdict_is_the_paired_tests(tmp_path):
    uids = [f"q{i}" for i in range(N)]
    rng = np.random.default_rng(5)
    base, other = _planted(rng, gain=0.07)
    _predictions(tmp_path / "warm", dict(zip(uids, base)))
    _predictions(tmp_path / "trained", dict(zip(uids, other)))
    paired = paired_against(tmp_path / "warm", tmp_path / "trained")
    assert paired is not None and paired.n == N and paired.significant
    figures = learning_figures({"untrained": 0.0, "warmstart": base.mean(), "trained": other.mean()}, 0.24, {},
                               {"trained": accuracy_interval(other.sum(), N)})
    figures.update(paired.figures(PAIRED))
    assert PairedResult.from_figures(figures, PAIRED) is not None
    verdict = verdict_of(figures)
    assert f"on the same {N} questions, paired against the warm-started policy: +" in verdict
    assert verdict.endswith("the method learned at this seed.")
    # The same accuracies, but the gain comes from questions answered differently at random:
    # not significant, and the verdict says no gain is shown.
    weak = PairedResult(N, 0.02, -0.01, 0.05, 0.21, "mcnemar_exact", 40, 29)
    figures.update(weak.figures(PAIRED))
    assert "not significant, so no gain from GRPO shown at this seed." in verdict_of(figures)
    assert "learned" not in verdict_of(figures)
    # A trained folder without predictions: no paired figures, the interval's floor rules.
    assert paired_against(tmp_path / "warm", tmp_path / "missing") is None
