"""The evaluation report: a Markdown summary, a per-task bar chart and a table beside the paper's
published numbers (Table 1 of arXiv 2504.12680)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Mapping, Sequence

from embodied_r.io import read_json
from embodied_r.scoring.metrics import (REL_DIRECTION, accuracy_interval, category_slug, format_interval,
                                        mean_of_means_interval, summary_interval)

REPORT_MD = "report.md"
CHART_PNG = "accuracy_by_task.png"
PAPER_CSV = "paper_comparison.csv"
REPORT_FILES = (REPORT_MD, CHART_PNG, PAPER_CSV)

# Table 1's columns, with the catalog's (benchmark, category) of each task.
PAPER_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("LP", "urbanvideo", "Landmark Position"),
    ("CF", "urbanvideo", "Counterfactual"),
    ("PE", "urbanvideo", "Progress Evaluation"),
    ("AG", "urbanvideo", "Action Generation"),
    ("RDist", "vsibench", "object_rel_distance"),
    ("RDir", "vsibench", REL_DIRECTION),
    ("RP", "vsibench", "route_planning"),
    ("AO", "vsibench", "obj_appearance_order"),
)
COLUMN_NAMES = ("avg",) + tuple(c for c, _, _ in PAPER_COLUMNS)

# Accuracy (%) on the test split; "avg" weighs every question once (it matches the
# question-weighted mean of the columns, not their plain mean).
PAPER_TABLE1: dict[str, tuple[float, ...]] = {
    "Random": (24.0, 19.7, 25.0, 21.8, 16.4, 25.0, 36.1, 28.3, 25.0),
    "GPT-4o": (35.7, 36.8, 44.7, 34.2, 33.8, 37.0, 41.3, 31.5, 28.5),
    "Gemini-1.5-Pro": (39.7, 37.4, 46.2, 38.8, 31.9, 51.3, 46.3, 36.0, 34.6),
    "OpenAI-o1": (37.2, 34.6, 53.3, 39.1, 28.0, 39.7, 35.8, 52.9, 39.8),
    "Gemini-2.5-Pro": (40.8, 40.0, 75.0, 38.7, 23.5, 42.0, 34.5, 52.4, 63.6),
    "Qwen2.5-VL-3B": (33.1, 32.1, 47.8, 34.0, 31.0, 27.9, 32.6, 39.0, 38.9),
    "Qwen2.5-VL-72B": (34.9, 34.7, 34.8, 26.4, 37.7, 40.8, 29.0, 32.5, 43.9),
    "SFT Qwen2.5-VL-3B": (41.7, 47.7, 33.4, 34.8, 39.2, 42.6, 42.3, 41.2, 43.9),
    "SFT Qwen2.5-VL-7B": (45.4, 40.2, 53.4, 38.0, 40.8, 47.8, 46.3, 44.1, 56.1),
    "Embodied-R (72B perceiver + 3B reasoner)": (51.1, 55.1, 59.9, 39.7, 47.6, 50.0, 44.3, 36.8, 72.0),
}
PAPER_MODEL = "Embodied-R (72B perceiver + 3B reasoner)"
# Embodied-R's accuracy (%) by the catalog's category names.
PAPER_ACCURACY: dict[str, float] = {
    cat: PAPER_TABLE1[PAPER_MODEL][i + 1] for i, (_, _, cat) in enumerate(PAPER_COLUMNS)
}
PAPER_AVERAGE = PAPER_TABLE1[PAPER_MODEL][0]

# One naming of tasks: UrbanVideo-Bench's names as they are, VSI-Bench's snake_case ids in the
# same words as the paper's Table 1 (its abbreviations in LEGEND).
TASK_NAMES = {
    "object_rel_direction": "Relative Direction",
    "object_rel_distance": "Relative Distance",
    "route_planning": "Route Planning",
    "obj_appearance_order": "Appearance Order",
    "object_counting": "Object Count",
    "object_abs_distance": "Absolute Distance",
    "object_size_estimation": "Object Size",
    "room_size_estimation": "Room Size",
}
LEGEND = ("Table 1 columns: avg = every question of the eight tasks weighed once; UrbanVideo-Bench: "
          "LP Landmark Position, CF Counterfactual, PE Progress Evaluation, AG Action Generation; "
          "VSI-Bench: RDist Relative Distance, RDir Relative Direction, RP Route Planning, "
          "AO Appearance Order.")
# Below this many questions a task's accuracy is flagged: one question moves it by 10+ points.
SMALL_TASK = 10


def task_name(category: str) -> str:
    if category in TASK_NAMES:
        return TASK_NAMES[category]
    return category.replace("_", " ").title() if category == category.lower() else category


def _interval(c: Mapping[str, Any]) -> tuple[float, float]:
    n = int(c["count"])
    return accuracy_interval(float(c.get("score_sum", float(c["accuracy"]) * n)), n)


def _subtype_mean_interval(c: Mapping[str, Any]) -> tuple[float, float]:
    subs = list((c.get("subtasks") or {}).values())
    return mean_of_means_interval([(1 / len(subs), float(s["accuracy"]) * int(s["count"]), int(s["count"]))
                                   for s in subs])


def _span(interval: tuple[float, float] | None) -> str:
    return "" if interval is None else format_interval(interval)


NOTE = (
    "Choice questions score 1 or 0; numeric ones VSI-Bench's mean relative accuracy. "
    "Unreadable answers count as wrong. Each task's accuracy counts every question once: "
    "relative direction pools its three subtypes, as the official code and the paper's "
    "Table 1 count it (VSI-Bench's own rule, the mean of the subtypes, is reported apart as "
    "its subtype mean). Intervals are 95 %: Wilson's score interval, numeric answers' fractional "
    "scores summed as successes; a mean of means (macro, subtype mean) adds its groups' "
    "Agresti-Coull variances. The paper's figures are its Table 1 on its own test split; figures "
    "from the tiny demo models show the method in miniature, not the paper's results."
)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def run_row(metrics: Mapping[str, float]) -> tuple[float | None, ...]:
    """Table 1's row as fractions (avg, LP, ..., AO), None where absent, counted as the paper
    counts: every question once (relative direction pooled over its subtypes)."""
    values: list[float | None] = [metrics.get("accuracy/paper_tasks")]
    values += [metrics.get(f"accuracy/{category_slug(cat)}") for _, _, cat in PAPER_COLUMNS]
    return tuple(values)


def comparison_rows(runs: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for model, values in PAPER_TABLE1.items():
        rows.append({"model": model, "source": "paper", **dict(zip(COLUMN_NAMES, values))})
    for label, metrics in runs.items():
        values = run_row(metrics)
        rows.append({"model": label, "source": "this run",
                     **{c: (None if v is None else round(100 * v, 1)) for c, v in zip(COLUMN_NAMES, values)}})
    return rows


def table_rows(categories: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per-task rows for a Prefect table artifact; ``paper_pct`` None where the paper has none."""
    return [{"benchmark": c["benchmark"], "task": task_name(c["category"]), "questions": int(c["count"]),
             "accuracy_pct": round(100 * float(c["accuracy"]), 1), "paper_pct": PAPER_ACCURACY.get(c["category"])}
            for c in categories]


def table_rows_from_folder(folder: Path) -> list[dict[str, Any]]:
    return table_rows(read_json(Path(folder) / "metrics.json")["categories"])


def render_markdown(categories: Sequence[Mapping[str, Any]], metrics: Mapping[str, float], *, model: str, split: str,
                    title: str = "Evaluation", others: Mapping[str, Mapping[str, float]] | None = None,
                    header: Mapping[str, str] | None = None, chance: Mapping[str, float] | None = None,
                    prompts: str = "") -> str:
    """``others`` (the baselines) join this run beside Table 1; ``header`` names the run, recipe
    and model version when the caller knows them."""
    n = int(metrics.get("count/overall", 0))
    chance = chance or {}
    lines = [f"# {title}", ""] + [f"- {k}: {v}" for k, v in (header or {}).items()]
    lines += [f"- model: `{model}`", f"- split: `{split}`, {n} questions"]
    if prompts:
        lines.append(f"- prompts: `{prompts}`")
    if "parsed/overall" in metrics:
        lines.append(f"- answers that could be read: {_pct(metrics['parsed/overall'])} %")
    if "consistency/ratio" in metrics:
        lines.append(f"- logically consistent answers (judge model): {_pct(metrics['consistency/ratio'])} % "
                     f"of {int(metrics.get('consistency/judged', 0))} judged")
    if "response_tokens/mean" in metrics:
        lines.append(f"- response length: mean {metrics['response_tokens/mean']:.0f} tokens, "
                     f"median {metrics['response_tokens/median']:.0f}, max {metrics['response_tokens/max']:.0f}")
    lines += ["", "## Accuracy per task", "",
              "| benchmark | task | questions | accuracy % | 95 % interval | chance % | paper (Embodied-R) % |",
              "|---|---|---:|---:|---:|---:|---:|"]
    small = 0
    for c in categories:
        paper = PAPER_ACCURACY.get(c["category"])
        low, high = _interval(c)
        few = int(c["count"]) < SMALL_TASK
        small += few
        guess = chance.get(c["category"])
        lines.append(f"| {c['benchmark']} | {task_name(c['category'])}{' ⚠' if few else ''} | {c['count']} | "
                     f"{_pct(c['accuracy'])} | {_span((low, high))} | {'' if guess is None else _pct(guess)} | "
                     f"{'' if paper is None else f'{paper:.1f}'} |")
        for sub, s in (c.get("subtasks") or {}).items():
            span = _span(accuracy_interval(float(s["accuracy"]) * int(s["count"]), int(s["count"])))
            lines.append(f"| | &nbsp;&nbsp;{sub} | {s['count']} | {_pct(s['accuracy'])} | {span} | | |")
        if "subtype_mean" in c:
            lines.append(f"| | &nbsp;&nbsp;mean of the subtypes (VSI-Bench's rule) | {c['count']} | "
                         f"{_pct(c['subtype_mean'])} | {_span(_subtype_mean_interval(c))} | | |")
    if n:
        if "accuracy/paper_tasks" in metrics:
            lines.append(f"| all | the paper's eight tasks (per question) | {int(metrics['count/paper_tasks'])} | "
                         f"{_pct(metrics['accuracy/paper_tasks'])} | "
                         f"{_span(summary_interval(metrics, 'accuracy/paper_tasks'))} | | {PAPER_AVERAGE:.1f} |")
        lines.append(f"| all | every question (micro) | {n} | {_pct(metrics['accuracy/overall'])} | "
                     f"{_span(summary_interval(metrics, 'accuracy/overall'))} | | |")
        lines.append(f"| all | mean over tasks (macro) | {n} | {_pct(metrics['accuracy/macro'])} | "
                     f"{_span(summary_interval(metrics, 'accuracy/macro'))} | | |")
    if small:
        lines += ["", f"⚠ {small} task(s) have fewer than {SMALL_TASK} questions: their accuracy is "
                  "little more than chance either way; read the interval, not the figure."]
    lines += ["", "## Beside the paper's Table 1", ""]
    lines += _table1_lines({"this evaluation": metrics, **(others or {})})
    lines += ["", LEGEND, "", NOTE, ""]
    return "\n".join(lines)


def _table1_lines(runs: Mapping[str, Mapping[str, float]]) -> list[str]:
    lines = ["| model | " + " | ".join(COLUMN_NAMES) + " |", "|---|" + "---:|" * len(COLUMN_NAMES)]
    for row in comparison_rows(runs):
        name = row["model"] if row["source"] == "paper" else f"**{row['model']}**"
        cells = ["" if row[c] is None else f"{row[c]:.1f}" for c in COLUMN_NAMES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def render_comparison(runs: Mapping[str, Mapping[str, float]], split: str,
                      title: str = "This project's runs beside the paper's Table 1") -> str:
    lines = [f"# {title}", "", f"Split: `{split}`. Accuracy %; avg weighs every question of the paper's "
             "eight tasks once.", ""]
    lines += _table1_lines(runs)
    lines += ["", LEGEND, "", NOTE, ""]
    return "\n".join(lines)


def plot_accuracy(categories: Sequence[Mapping[str, Any]], path: Path, title: str = "Accuracy per task",
                  chance: Mapping[str, float] | None = None) -> Path:
    """A bar per task with its 95 % interval, chance and the paper's figure marked."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    chance = chance or {}
    names = [f"{task_name(c['category'])} ({c['benchmark']}, n={c['count']}"
             f"{', few!' if int(c['count']) < SMALL_TASK else ''})" for c in categories]
    ours = [100 * float(c["accuracy"]) for c in categories]
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(names), 2) + 1.4), dpi=100)
    try:
        ys = list(range(len(names)))
        spans = [_interval(c) for c in categories]
        errors = [[v - 100 * lo for v, (lo, _) in zip(ours, spans)], [100 * hi - v for v, (_, hi) in zip(ours, spans)]]
        ax.barh(ys, ours, color="#4C72B0", label="this evaluation (95 % interval)", xerr=errors or None,
                error_kw={"ecolor": "#333333", "capsize": 3, "lw": 1})
        guesses = [(y, 100 * chance[c["category"]]) for y, c in zip(ys, categories) if c["category"] in chance]
        if guesses:
            ax.scatter([v for _, v in guesses], [y for y, _ in guesses], marker="|", s=300, color="#888888",
                       zorder=3, label="chance (random option)")
        else:
            ax.axvline(25, color="#888888", ls="--", lw=1, label="chance, 4 options")
        marked = [(y, PAPER_ACCURACY[c["category"]]) for y, c in zip(ys, categories) if c["category"] in PAPER_ACCURACY]
        if marked:
            ax.scatter([v for _, v in marked], [y for y, _ in marked], marker="|", s=300, color="#C44E52",
                       zorder=3, label="paper (Embodied-R)")
        for y, value in zip(ys, ours):
            ax.text(value + 1, y, f"{value:.1f}", va="center", fontsize=8)
        ax.set_yticks(ys, names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 105)
        ax.set_xlabel("accuracy %")
        ax.set_title(title)
        if categories:
            # Under the axes: inside them it covers a bar.
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / max(len(names), 2)), ncol=3,
                      fontsize=8, frameon=False)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)
    return path


def comparison_csv(runs: Mapping[str, Mapping[str, float]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["model", "source", *COLUMN_NAMES], lineterminator="\n")
    writer.writeheader()
    for row in comparison_rows(runs):
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def write_report(folder: Path, categories: Sequence[Mapping[str, Any]], metrics: Mapping[str, float], *, model: str,
                 split: str, title: str = "Evaluation", others: Mapping[str, Mapping[str, float]] | None = None,
                 chance: Mapping[str, float] | None = None, prompts: str = "") -> list[Path]:
    folder = Path(folder)
    md = folder / REPORT_MD
    md.write_text(render_markdown(categories, metrics, model=model, split=split, title=title, others=others,
                                  chance=chance, prompts=prompts), encoding="utf-8")
    chart = plot_accuracy(categories, folder / CHART_PNG, title=f"{title}: {split} split", chance=chance)
    table = folder / PAPER_CSV
    table.write_text(comparison_csv({"this evaluation": metrics, **(others or {})}), encoding="utf-8")
    return [md, chart, table]


def render_folder(folder: Path, header: Mapping[str, str] | None = None) -> str:
    """A finished evaluation's report again, headed by what is known only once the run ends."""
    from embodied_r.evaluation.learning import CURVES_PNG, learning_stages, render_learning

    data = read_json(Path(folder) / "metrics.json")
    summary = read_json(Path(folder) / "summary.json")
    text = render_markdown(data["categories"], data["metrics"], model=str(summary.get("model_label") or
                           summary.get("model", "")), split=str(summary.get("split", "")),
                           header=header, chance=data.get("chance"), prompts=str(summary.get("prompts") or ""))
    if any(k.startswith("learning/accuracy/") for k in summary):  # the evaluate stage's report.md has it
        text += render_learning(summary, learning_stages(summary), (Path(folder) / CURVES_PNG).is_file())
    return text
