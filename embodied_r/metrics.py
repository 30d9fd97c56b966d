"""Scoring answers and summarising scores per task.

Multiple-choice answers score 1 or 0; numeric answers score VSI-Bench's mean relative
accuracy. An answer that cannot be parsed scores 0 and stays in the denominator: dropping
it, as the original evaluation did, inflates accuracy.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from typing import Any, Iterable, Mapping

import numpy as np

from embodied_r.answers import extract_answer, format_number, parse_choice, parse_number

# VSI-Bench's thresholds: 0.50, 0.55, ..., 0.95.
MRA_THRESHOLDS = np.linspace(0.5, 0.95, 10)

ANSWER_TYPES = ("choice", "number")


def _as_number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return parse_number(value)
    return None


def mean_relative_accuracy(prediction: Any, truth: Any) -> float:
    """VSI-Bench's mean relative accuracy of a numeric prediction, in [0, 1].

    A threshold t in 0.50..0.95 counts when ``|pred - truth| / |truth| <= 1 - t``; the
    score is the fraction of thresholds met, as in the official scorer. Where the official
    code is undefined or wrong this follows the metric's intent:
    a prediction that is not a finite number scores 0 (the official worst case); a truth
    of 0 (division by zero there) scores 1 for an exact 0 and 0 otherwise; a negative
    truth is compared by magnitude (there the negative ratio met every threshold).
    Raises ValueError when ``truth`` is not a number: that is bad data, not a bad answer.
    """
    truth_value = _as_number(truth)
    if truth_value is None:
        raise ValueError(f"ground truth {truth!r} is not a finite number")
    pred_value = _as_number(prediction)
    if pred_value is None:
        return 0.0
    if truth_value == 0.0:
        return 1.0 if pred_value == 0.0 else 0.0
    relative_error = abs(pred_value - truth_value) / abs(truth_value)
    return float(np.mean(relative_error <= 1.0 - MRA_THRESHOLDS))


def score_answer(
    completion: str, solution: str, answer_type: str, n_options: int | None = None
) -> tuple[str, float]:
    """(parsed prediction or "", score) for one completion.

    The answer is read only inside the last ``<answer>`` block. Choice: 1.0 when the
    letter equals the solution's. Number: mean relative accuracy.
    """
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"answer_type must be one of {ANSWER_TYPES}, got {answer_type!r}")
    answer = extract_answer(completion or "")
    if answer_type == "choice":
        letter = parse_choice(answer, n_options)
        if letter is None:
            return "", 0.0
        return letter, 1.0 if letter == str(solution).strip().upper() else 0.0
    value = parse_number(answer)
    if value is None:
        return "", 0.0
    return format_number(value), mean_relative_accuracy(value, solution)


def slug(name: str) -> str:
    """A category or benchmark name as a metric-name component: lower case, ``_`` separated."""
    text = re.sub(r"[^0-9a-zA-Z]+", "_", str(name)).strip("_").lower()
    return text or "unknown"


def _length_stats(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        f"{prefix}/mean": float(statistics.fmean(values)),
        f"{prefix}/median": float(statistics.median(values)),
        f"{prefix}/max": float(max(values)),
        f"{prefix}/min": float(min(values)),
    }


def aggregate(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Flat metrics over scored rows (keys: category, benchmark, score; optional
    prediction, completion, completion_tokens).

    Keys are valid MLflow metric names: ``accuracy/overall`` (micro, every question
    counts once), ``accuracy/macro`` (mean over categories, the paper's "avg"),
    ``accuracy/<category>``, ``accuracy_by_benchmark/<benchmark>``, ``count/...``,
    ``parsed/overall`` (share of answers that could be read), and response length stats.
    """
    rows = list(rows)
    out: dict[str, float] = {"count/overall": float(len(rows))}
    if not rows:
        return out
    by_category: dict[str, list[float]] = defaultdict(list)
    by_benchmark: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        score = float(row["score"])
        category = slug(row.get("category", "unknown"))
        if category in ("overall", "macro"):  # keep clear of the summary keys
            category = f"category_{category}"
        by_category[category].append(score)
        by_benchmark[slug(row.get("benchmark", "unknown"))].append(score)

    out["accuracy/overall"] = float(statistics.fmean(float(r["score"]) for r in rows))
    category_means = {name: float(statistics.fmean(s)) for name, s in by_category.items()}
    out["accuracy/macro"] = float(statistics.fmean(category_means.values()))
    for name, mean in sorted(category_means.items()):
        out[f"accuracy/{name}"] = mean
        out[f"count/{name}"] = float(len(by_category[name]))
    for name, scores in sorted(by_benchmark.items()):
        out[f"accuracy_by_benchmark/{name}"] = float(statistics.fmean(scores))
        out[f"count_by_benchmark/{name}"] = float(len(scores))

    if all("prediction" in r for r in rows):
        out["parsed/overall"] = float(statistics.fmean(1.0 if r["prediction"] else 0.0 for r in rows))
    tokens = [float(r["completion_tokens"]) for r in rows if r.get("completion_tokens") is not None]
    out.update(_length_stats("response_tokens", tokens))
    chars = [float(len(r["completion"])) for r in rows if isinstance(r.get("completion"), str)]
    out.update(_length_stats("response_chars", chars))
    return out


def category_table(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (benchmark, category) with count, correct-equivalent sum and accuracy."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        groups[(str(row.get("benchmark", "")), str(row.get("category", "")))].append(float(row["score"]))
    return [
        {
            "benchmark": bench,
            "category": cat,
            "count": len(scores),
            "score_sum": float(sum(scores)),
            "accuracy": float(statistics.fmean(scores)),
        }
        for (bench, cat), scores in sorted(groups.items())
    ]
