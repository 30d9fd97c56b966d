"""Scoring answers and summarising scores per task, as the benchmarks score them: a choice 1 or
0, a number VSI-Bench's mean relative accuracy. An unparseable answer or a failed generation
scores 0 and stays in the denominator, as in the official evaluation (whose ``dropna`` removes
no row: its reader returns the reply itself when it finds no letter)."""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from embodied_r.scoring.config import NumberParsing
from embodied_r.scoring.answers import (
    ChoiceParser,
    extract_answer,
    format_number,
    parse_number,
    read_choice,
)
from embodied_r.benchmarks.registry import BENCHMARKS

# VSI-Bench's thresholds: 0.50, 0.55, ..., 0.95 (its scorer builds the same array).
MRA_THRESHOLDS = np.linspace(0.5, 0.95, 10)

ANSWER_TYPES = ("choice", "number")

REL_DIRECTION = "object_rel_direction"
REL_DIRECTION_SUBTASKS = {2: "easy", 3: "medium", 4: "hard"}

# Summary keys a category slug must not take.
_RESERVED = {"overall", "macro", "paper_tasks"}
Z95 = 1.96
# An accuracy's 95 % bounds sit beside it: ``accuracy/overall_ci_low``.
CI_LOW, CI_HIGH = "_ci_low", "_ci_high"
_PAPER_CATEGORIES = {t for b in BENCHMARKS if not b.evaluation_only for t in b.tasks}


def parse_official_number(text: Any) -> float | None:
    """A prediction as VSI-Bench's scorer reads it: the text up to the first space, trailing
    dots removed, through ``float``; None when not finite. "about 3", "3m", "three" are not."""
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, (int, float, np.integer, np.floating)):
        value = float(text)
    else:
        token = str(text).split(" ")[0].rstrip(".").strip()
        try:
            value = float(token)
        except ValueError:
            return None
    return value if math.isfinite(value) else None


def mean_relative_accuracy(prediction: Any, truth: Any) -> float:
    """VSI-Bench's mean relative accuracy, in the official scorer's floating-point steps so
    that errors of exactly 5 % or 50 % agree. Where the official code is undefined: a truth of 0
    scores 1 for an exact 0, else 0; a negative truth is compared by magnitude. A truth that is
    no number raises ValueError: bad data, not a bad answer."""
    truth_value = parse_official_number(truth.strip() if isinstance(truth, str) else truth)
    if truth_value is None:
        raise ValueError(f"ground truth {truth!r} is not a finite number")
    pred_value = parse_official_number(prediction)
    if pred_value is None:
        return 0.0
    if truth_value == 0.0:
        return 1.0 if pred_value == 0.0 else 0.0
    relative_error = abs(pred_value - truth_value) / abs(truth_value)
    return float(np.mean(relative_error <= 1.0 - MRA_THRESHOLDS))


def score_answer(
    completion: str, solution: str, answer_type: str, n_options: int | None = None,
    number_parsing: NumberParsing = "lenient", choice_parser: ChoiceParser = "strict",
) -> tuple[str, float]:
    """(parsed prediction or "", score). A number is read from the last ``<answer>`` block,
    "lenient" as the rewards read it, "official" as VSI-Bench's scorer (evaluation's default)."""
    if answer_type not in ANSWER_TYPES:
        raise ValueError(f"answer_type must be one of {ANSWER_TYPES}, got {answer_type!r}")
    if answer_type == "choice":
        letter = read_choice(completion or "", n_options, choice_parser)
        if letter is None:
            return "", 0.0
        return letter, 1.0 if letter == str(solution).strip().upper() else 0.0
    answer = extract_answer(completion or "")
    if number_parsing == "official":
        value = parse_official_number(answer)
    elif number_parsing == "lenient":
        value = parse_number(answer)
    else:
        raise ValueError(f"number_parsing must be 'official' or 'lenient', got {number_parsing!r}")
    if value is None:
        return "", 0.0
    return format_number(value), mean_relative_accuracy(value, solution)


def subtask_of(category: str, options: Iterable[str] | None) -> str | None:
    """The relative-direction subtype (easy, medium, hard by option count), else None: the
    catalog keeps all three in one category."""
    if category != REL_DIRECTION:
        return None
    return REL_DIRECTION_SUBTASKS.get(len(list(options or [])))


def slug(name: str) -> str:
    text = re.sub(r"[^0-9a-zA-Z]+", "_", str(name)).strip("_").lower()
    return text or "unknown"


def category_slug(name: str) -> str:
    text = slug(name)
    return f"category_{text}" if text in _RESERVED else text


def _length_stats(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        f"{prefix}/mean": float(statistics.fmean(values)),
        f"{prefix}/median": float(statistics.median(values)),
        f"{prefix}/p90": float(ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]),
        f"{prefix}/max": float(ordered[-1]),
        f"{prefix}/min": float(ordered[0]),
    }


def accuracy_interval(score_sum: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The 95 % Wilson interval of ``score_sum`` successes in ``n``. Fractional scores (numeric
    answers) are summed as successes: a score in [0, 1] of mean p varies by at most p(1 - p),
    so the interval errs wide, never narrow."""
    if n <= 0:
        return 0.0, 1.0
    p = min(max(score_sum / n, 0.0), 1.0)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_of_means_interval(groups: Sequence[tuple[float, float, int]], z: float = Z95) -> tuple[float, float]:
    """The 95 % interval of a weighted mean of independent group accuracies; ``groups`` are
    (weight, score_sum, n), the weights summing to 1. Each variance is taken at Agresti and
    Coull's adjusted accuracy, so a group scored all 0 or all 1 still has a spread."""
    groups = [(w, s, n) for w, s, n in groups if n > 0]
    if not groups:
        return 0.0, 1.0
    centre = variance = 0.0
    for weight, score_sum, n in groups:
        n_adj = n + z * z
        p_adj = (score_sum + z * z / 2) / n_adj
        centre += weight * score_sum / n
        variance += weight * weight * p_adj * (1 - p_adj) / n_adj
    half = z * math.sqrt(variance)
    return max(0.0, centre - half), min(1.0, centre + half)


def format_interval(interval: tuple[float, float]) -> str:
    """``[37.5, 53.3]``, in percent."""
    return f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


def format_accuracy(value: float, interval: tuple[float, float] | None = None) -> str:
    """``45.3 % [37.5, 53.3]``."""
    text = f"{100 * value:.1f} %"
    return text if interval is None else f"{text} {format_interval(interval)}"


def summary_interval(summary: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    """The bounds ``aggregate`` wrote beside ``key``, else Wilson's from its ``count/...``; None
    when neither is there (a task's mean of its subtypes)."""
    low, high = summary.get(key + CI_LOW), summary.get(key + CI_HIGH)
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        return float(low), float(high)
    value = summary.get(key)
    if not key.startswith("accuracy"):
        return None
    count = summary.get("count" + key[len("accuracy"):])
    if isinstance(value, (int, float)) and isinstance(count, (int, float)) and count > 0:
        return accuracy_interval(float(value) * count, int(count))
    return None


def _with_interval(out: dict[str, float], key: str, interval: tuple[float, float]) -> None:
    out[key + CI_LOW], out[key + CI_HIGH] = interval


def task_score(scores_by_subtask: Mapping[str | None, list[float]]) -> float:
    """VSI-Bench's rule: the mean of the subtypes' means."""
    return float(statistics.fmean(statistics.fmean(s) for s in scores_by_subtask.values() if s))


def pooled_score(scores_by_subtask: Mapping[str | None, list[float]]) -> float:
    """Every question counted once, as the official code and the paper's Table 1 count."""
    return float(statistics.fmean(s for group in scores_by_subtask.values() for s in group))


def _groups(rows: list[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str | None, list[float]]]:
    groups: dict[tuple[str, str], dict[str | None, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        key = (str(row.get("benchmark", "")), str(row.get("category", "")))
        groups[key][row.get("subtask") or None].append(float(row["score"]))
    return groups


def aggregate(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Flat MLflow metrics over scored rows (benchmark, category, score; optional subtask,
    prediction, completion, completion_tokens). ``accuracy/overall`` and ``accuracy/<task>``
    count every question once (a task's subtypes pooled, as the paper); ``accuracy/paper_tasks``
    is the paper's "avg"; ``accuracy/macro`` is the mean of VSI-Bench's task scores (its
    "overall"), and ``.../subtype_mean`` a task's by VSI-Bench's rule."""
    rows = list(rows)
    out: dict[str, float] = {"count/overall": float(len(rows))}
    if not rows:
        return out
    out["accuracy/overall"] = float(statistics.fmean(float(r["score"]) for r in rows))
    _with_interval(out, "accuracy/overall", accuracy_interval(sum(float(r["score"]) for r in rows), len(rows)))
    task_scores, task_groups, tasks_by_benchmark = _task_metrics(out, rows)
    by_benchmark: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by_benchmark[slug(row.get("benchmark", "unknown"))].append(float(row["score"]))
    out["accuracy/macro"] = float(statistics.fmean(task_scores.values()))
    _with_interval(out, "accuracy/macro", mean_of_means_interval(
        [(w / len(task_groups), s, n) for groups in task_groups.values() for w, s, n in groups]))
    for name, scores in sorted(by_benchmark.items()):
        out[f"accuracy_by_benchmark/{name}"] = float(statistics.fmean(scores))
        out[f"macro_by_benchmark/{name}"] = float(statistics.fmean(tasks_by_benchmark[name]))
        out[f"count_by_benchmark/{name}"] = float(len(scores))
    paper = [float(r["score"]) for r in rows if r.get("category") in _PAPER_CATEGORIES]
    if paper:
        out["accuracy/paper_tasks"] = float(statistics.fmean(paper))
        _with_interval(out, "accuracy/paper_tasks", accuracy_interval(sum(paper), len(paper)))
        out["count/paper_tasks"] = float(len(paper))
    if all("prediction" in r for r in rows):
        out["parsed/overall"] = float(statistics.fmean(1.0 if r["prediction"] else 0.0 for r in rows))
    tokens = [float(r["completion_tokens"]) for r in rows if r.get("completion_tokens") is not None]
    out.update(_length_stats("response_tokens", tokens))
    chars = [float(len(r["completion"])) for r in rows if isinstance(r.get("completion"), str)]
    out.update(_length_stats("response_chars", chars))
    return out


def _task_metrics(out: dict[str, float], rows: list[Mapping[str, Any]]) -> tuple[
        dict[str, float], dict[str, list[tuple[float, float, int]]], dict[str, list[float]]]:
    """Each task's figures into ``out``; its score by VSI-Bench's rule, the (weight within the
    task, score sum, count) of its subtypes for the macro's interval, and the scores by benchmark."""
    task_scores: dict[str, float] = {}
    task_groups: dict[str, list[tuple[float, float, int]]] = {}
    tasks_by_benchmark: dict[str, list[float]] = defaultdict(list)
    for (bench, cat), subtasks in sorted(_groups(rows).items()):
        name = category_slug(cat)
        score = task_score(subtasks)
        task_scores[name] = score
        filled = [g for g in subtasks.values() if g]
        task_groups[name] = [(1 / len(filled), float(sum(g)), len(g)) for g in filled]
        out[f"accuracy/{name}"] = pooled_score(subtasks)
        out[f"count/{name}"] = float(sum(len(s) for s in subtasks.values()))
        named = {k: v for k, v in subtasks.items() if k}
        if named:
            out[f"accuracy/{name}/subtype_mean"] = score
            for sub, scores in sorted(named.items()):
                out[f"accuracy/{name}/{slug(sub)}"] = float(statistics.fmean(scores))
                out[f"count/{name}/{slug(sub)}"] = float(len(scores))
        tasks_by_benchmark[slug(bench)].append(score)
    return task_scores, task_groups, tasks_by_benchmark


def category_table(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (benchmark, category), with its subtasks and their mean where it has them."""
    table = []
    for (bench, cat), subtasks in sorted(_groups(list(rows)).items()):
        scores = [s for group in subtasks.values() for s in group]
        entry: dict[str, Any] = {
            "benchmark": bench,
            "category": cat,
            "count": len(scores),
            "score_sum": float(sum(scores)),
            "accuracy": pooled_score(subtasks),
        }
        named = {k: v for k, v in subtasks.items() if k}
        if named:
            entry["subtype_mean"] = task_score(subtasks)
            entry["subtasks"] = {
                k: {"count": len(v), "accuracy": float(statistics.fmean(v))} for k, v in sorted(named.items())
            }
        table.append(entry)
    return table


def guess_chance(record: Mapping[str, Any]) -> float | None:
    """A uniform guess's expected score; None without options (a guessed number almost never
    meets VSI-Bench's thresholds)."""
    options = record.get("options")
    if record.get("answer_type") == "number" or not options:
        return None
    return 1.0 / len(options)


def chance_accuracy(records: Iterable[Mapping[str, Any]]) -> float:
    guesses = [guess_chance(r) or 0.0 for r in records]
    return sum(guesses) / len(guesses) if guesses else 0.0


def chance_metrics(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Uniform guessing's expected figure under each ``aggregate`` accuracy key: every figure
    is a mean (of means) of scores, so expected scores aggregate to the expected figure."""
    rows = [{"benchmark": r.get("benchmark", ""), "category": r.get("category", ""),
             "subtask": subtask_of(str(r.get("category", "")), r.get("options")),
             "score": guess_chance(r) or 0.0} for r in records]
    return {k: v for k, v in aggregate(rows).items()
            if k.startswith(("accuracy", "macro_by")) and not k.endswith((CI_LOW, CI_HIGH))}


def chance_interval(chances: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """Where a uniform guesser's accuracy lands 95 % of the time (normal approximation): a range
    of outcomes, not an estimate's interval, since chance itself is known exactly."""
    if not chances:
        return 0.0, 1.0
    mean = sum(chances) / len(chances)
    half = z * math.sqrt(sum(p * (1 - p) for p in chances)) / len(chances)
    return max(0.0, mean - half), min(1.0, mean + half)


def chance_levels(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    by_task: dict[str, list[float]] = {}
    for r in records:
        chance = guess_chance(r)
        if chance is not None:
            by_task.setdefault(r["category"], []).append(chance)
    return {task: sum(v) / len(v) for task, v in by_task.items()}
