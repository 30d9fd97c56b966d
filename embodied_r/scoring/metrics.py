"""Scoring answers and summarising scores per task, as the benchmarks score them.

Multiple-choice answers score 1 or 0; numeric answers score VSI-Bench's mean relative
accuracy. An answer that cannot be parsed scores 0 and stays in the denominator, as in
the official evaluation (its reader returns the reply itself when it finds no letter, so
its ``dropna`` removes no row). A failed generation also scores 0 and stays in the
denominator; the evaluation stage counts and lists it as failed.

Relative direction has three subtypes (easy: two options, medium: three, hard: four),
which the catalog keeps in one ``object_rel_direction`` category; the subtype is
recovered from the option count. Two ways of scoring the task, both reported:

- pooled (``accuracy/object_rel_direction``): every question counts once. The official
  code merges the three subtypes into one category before scoring, so this is the figure
  the paper's Table 1 reports, and the one the report sets beside it;
- VSI-Bench's rule (``accuracy/object_rel_direction/subtype_mean``): the mean of the
  three subtype accuracies. ``accuracy/macro`` (VSI-Bench's "overall" when all its tasks
  are there) uses this one.
"""

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
# VSI-Bench's relative-direction subtypes, told apart by their option count.
REL_DIRECTION_SUBTASKS = {2: "easy", 3: "medium", 4: "hard"}

# Summary keys a category slug must not take.
_RESERVED = {"overall", "macro", "paper_tasks"}
# The normal quantile of a two-sided 95 % interval.
Z95 = 1.96
# The bounds of an accuracy's 95 % interval sit beside it: ``accuracy/overall_ci_low``.
CI_LOW, CI_HIGH = "_ci_low", "_ci_high"
_PAPER_CATEGORIES = {t for b in BENCHMARKS if not b.evaluation_only for t in b.tasks}


def parse_official_number(text: Any) -> float | None:
    """A prediction read as VSI-Bench's scorer reads it: the text up to the first space,
    trailing dots removed, through Python's ``float``; None when that fails or is not finite.

    Stricter than ``answers.parse_number``: "about 3", "3m" and "three" are not numbers here.
    """
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
    """VSI-Bench's mean relative accuracy of a numeric prediction, in [0, 1].

    A threshold t in 0.50..0.95 counts when ``|pred - truth| / |truth| <= 1 - t``; the
    score is the fraction of thresholds met, computed in the same floating-point steps as
    the official scorer, so boundary cases (an error of exactly 5 % or 50 %) agree. A
    string prediction is read as the official scorer reads it (``parse_official_number``);
    one that is not a finite number scores 0, the official worst case. Where the official
    code is undefined this follows the metric's intent: a truth of 0 (a division by zero
    there) scores 1 for an exact 0 and 0 otherwise; a negative truth is compared by magnitude.
    Raises ValueError when ``truth`` is not a number: that is bad data, not a bad answer.
    """
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
    """(parsed prediction or "", score) for one completion.

    Choice: 1.0 when the letter equals the solution's; the letter is read by
    ``answers.read_choice`` with ``choice_parser`` ("strict": only inside the last
    ``<answer>`` block; "official_reward"/"official_eval": the official code's readers).
    Number: the answer inside the last ``<answer>`` block, mean relative accuracy, read by
    ``answers.parse_number`` ("lenient", what the rewards use) or as VSI-Bench's scorer
    reads it ("official", what evaluation uses by default).
    """
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
    """The VSI-Bench relative-direction subtype of a question, or None for other tasks."""
    if category != REL_DIRECTION:
        return None
    return REL_DIRECTION_SUBTASKS.get(len(list(options or [])))


def slug(name: str) -> str:
    """A category or benchmark name as a metric-name component: lower case, ``_`` separated."""
    text = re.sub(r"[^0-9a-zA-Z]+", "_", str(name)).strip("_").lower()
    return text or "unknown"


def category_slug(name: str) -> str:
    """``slug`` kept clear of the summary keys (``overall``, ``macro``, ``paper_tasks``)."""
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
    """The 95 % Wilson score interval of an accuracy of ``score_sum`` over ``n`` questions.

    Choice answers score 0 or 1, so ``score_sum`` is the count right and this is Wilson's
    interval exactly. Numeric answers score a fraction (mean relative accuracy): their
    scores are summed and the sum taken as that many successes (Wilson on the summed
    score). A score in [0, 1] with mean p varies by at most p(1 - p), the binomial's
    variance, so the interval errs wide, never narrow. With no questions: (0, 1).
    """
    if n <= 0:
        return 0.0, 1.0
    p = min(max(score_sum / n, 0.0), 1.0)
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_of_means_interval(groups: Sequence[tuple[float, float, int]], z: float = Z95) -> tuple[float, float]:
    """The 95 % interval of a weighted mean of group accuracies (``accuracy/macro``, a task's
    mean of its subtypes); ``groups`` are (weight, score_sum, n), the weights summing to 1.

    Centred on the weighted mean; the groups are independent, so their variances add. Each
    group's variance is taken at Agresti and Coull's adjusted accuracy (z^2/2 successes and
    failures added), so a group scored all 0 or all 1 still has a spread. For one group of a
    few dozen questions it is close to ``accuracy_interval``; at the extremes it is narrower.
    """
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
    """``[37.5, 53.3]``: an interval of fractions, in percent."""
    return f"[{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]"


def format_accuracy(value: float, interval: tuple[float, float] | None = None) -> str:
    """``45.3 % [37.5, 53.3]``: an accuracy in percent with its 95 % interval when known."""
    text = f"{100 * value:.1f} %"
    return text if interval is None else f"{text} {format_interval(interval)}"


def summary_interval(summary: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    """The 95 % interval of ``key`` (an accuracy of an evaluation summary): the bounds
    ``aggregate`` wrote beside it, else Wilson's from its question count (``count/...``);
    None when neither is there (a task's mean of its subtypes)."""
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
    """A task's score by VSI-Bench's rule: the mean of its subtypes' means (one group: the
    plain mean)."""
    return float(statistics.fmean(statistics.fmean(s) for s in scores_by_subtask.values() if s))


def pooled_score(scores_by_subtask: Mapping[str | None, list[float]]) -> float:
    """A task's score with every question counted once, subtypes pooled (the official
    code's and the paper's way)."""
    return float(statistics.fmean(s for group in scores_by_subtask.values() for s in group))


def _groups(rows: list[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str | None, list[float]]]:
    groups: dict[tuple[str, str], dict[str | None, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        key = (str(row.get("benchmark", "")), str(row.get("category", "")))
        groups[key][row.get("subtask") or None].append(float(row["score"]))
    return groups


def aggregate(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Flat metrics over scored rows (keys: benchmark, category, score; optional subtask,
    prediction, completion, completion_tokens). Every key is a valid MLflow metric name.

    - ``accuracy/overall``: every question counts once (micro). The paper's "avg" is this
      figure over its eight tasks: ``accuracy/paper_tasks``.
    - ``accuracy/<category>``: the task's accuracy, every question counted once (relative
      direction: its subtypes pooled, as the paper counts; each subtype is also reported as
      ``accuracy/object_rel_direction/<subtype>``, and VSI-Bench's mean of the subtypes as
      ``accuracy/object_rel_direction/subtype_mean``).
    - ``accuracy/macro``: mean of the task scores by VSI-Bench's rule (subtype means; its
      "overall" when all its tasks are there); ``macro_by_benchmark/<benchmark>`` the same
      within one benchmark.
    - ``accuracy_by_benchmark/<benchmark>``: micro within one benchmark.
    - ``accuracy/{overall,macro,paper_tasks}_ci_low`` and ``_ci_high``: their 95 % intervals
      (``accuracy_interval``; the macro's ``mean_of_means_interval``).
    - ``count/...``, ``parsed/overall`` (share of answers that could be read), and
      response length statistics in tokens and characters.
    """
    rows = list(rows)
    out: dict[str, float] = {"count/overall": float(len(rows))}
    if not rows:
        return out
    out["accuracy/overall"] = float(statistics.fmean(float(r["score"]) for r in rows))
    _with_interval(out, "accuracy/overall", accuracy_interval(sum(float(r["score"]) for r in rows), len(rows)))

    task_scores: dict[str, float] = {}
    # (group weight within its task, score sum, count) of each subtype: the macro's interval.
    task_groups: dict[str, list[tuple[float, float, int]]] = {}
    by_benchmark: dict[str, list[float]] = defaultdict(list)
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


def category_table(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (benchmark, category): count, correct-equivalent sum, the task's
    accuracy over its questions (``accuracy``) and, for tasks with subtypes, ``subtasks``:
    {name: {count, accuracy}} and VSI-Bench's mean of them (``subtype_mean``)."""
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
    """A uniform guess's expected score on one question: one over its options, or None for
    a question without options (a guessed number almost never meets VSI-Bench's thresholds)."""
    options = record.get("options")
    if record.get("answer_type") == "number" or not options:
        return None
    return 1.0 / len(options)


def chance_accuracy(records: Iterable[Mapping[str, Any]]) -> float:
    """Overall accuracy of uniform guessing, numeric questions counted as 0."""
    guesses = [guess_chance(r) or 0.0 for r in records]
    return sum(guesses) / len(guesses) if guesses else 0.0


def chance_metrics(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """What uniform guessing is expected to score on ``records`` under each ``aggregate``
    accuracy key (numeric questions 0): every figure is a mean, or a mean of means, of the
    questions' scores, so the guesses' expected scores aggregate to the expected figure.
    A model compared on a metric must clear the same metric's chance."""
    rows = [{"benchmark": r.get("benchmark", ""), "category": r.get("category", ""),
             "subtask": subtask_of(str(r.get("category", "")), r.get("options")),
             "score": guess_chance(r) or 0.0} for r in records]
    return {k: v for k, v in aggregate(rows).items()
            if k.startswith(("accuracy", "macro_by")) and not k.endswith((CI_LOW, CI_HIGH))}


def chance_interval(chances: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """Where a uniform guesser's accuracy on these questions lands 95 % of the time: each
    question is right with its own chance (``guess_chance``, numbers 0), the normal
    approximation of their mean. A range of outcomes, not an estimate's interval: chance
    itself is known exactly."""
    if not chances:
        return 0.0, 1.0
    mean = sum(chances) / len(chances)
    half = z * math.sqrt(sum(p * (1 - p) for p in chances)) / len(chances)
    return max(0.0, mean - half), min(1.0, mean + half)


def chance_levels(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per task, the accuracy of uniform guessing (tasks with options only)."""
    by_task: dict[str, list[float]] = {}
    for r in records:
        chance = guess_chance(r)
        if chance is not None:
            by_task.setdefault(r["category"], []).append(chance)
    return {task: sum(v) / len(v) for task, v in by_task.items()}
