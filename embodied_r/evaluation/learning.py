"""The learning figures of a run: test accuracy before training, after the warm start and
after GRPO beside chance, each training stage's rewards in its first and last quarter,
and the reward curves of all stages on one step axis (``reward_curves.png``).

The evaluation stage writes them when the recipe compares baselines; they come from the
baseline evaluations' summaries and the training stages' ``summary.json`` (quarters)
and ``history.json`` (per-step rewards), read as files.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from embodied_r.io import read_json
from embodied_r.scoring.metrics import chance_accuracy

CURVES_PNG = "reward_curves.png"
PREFIX = "learning"
HISTORY_FILE = "history.json"  # written by the GRPO trainer (training.learning.HISTORY_FILE)
ACCURACY = "accuracy/overall"


def _series(history: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(e["step"]), float(e[key])) for e in history
            if isinstance(e.get("step"), int) and isinstance(e.get(key), (int, float))
            and not isinstance(e.get(key), bool) and math.isfinite(e[key])]


def reward_curves(training: Mapping[str, str]) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[str, int]]]:
    """Each reward over the steps of all stages, on one global step axis, and where each
    stage starts. Stages without a history (not trained here) are skipped."""
    curves: dict[str, list[tuple[int, float]]] = {}
    starts: list[tuple[str, int]] = []
    offset = 0
    for stage, folder in training.items():
        path = Path(folder) / HISTORY_FILE
        if not path.is_file():
            continue
        data = read_json(path)
        history = data.get("history", [])
        keys = {"reward": "reward", **{n: f"rewards/{n}/mean" for n in data.get("reward_funcs", [])}}
        starts.append((stage, offset))
        last = offset
        for name, key in keys.items():
            for step, value in _series(history, key):
                curves.setdefault(name, []).append((offset + step, value))
                last = max(last, offset + step)
        offset = last
    return curves, starts


def plot_reward_curves(training: Mapping[str, str], path: Path) -> Path | None:
    curves, starts = reward_curves(training)
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, points in curves.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=name, linewidth=2.2 if name == "reward" else 1.3)
    for stage, start in starts:
        ax.axvline(start, color="grey", linestyle=":", linewidth=1)
        ax.text(start, 1.02, stage, transform=ax.get_xaxis_transform(), fontsize=8)
    ax.set_xlabel("training step (all stages)")
    ax.set_ylabel("mean reward of the step's completions")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def learning_figures(accuracies: Mapping[str, float | None], chance: float,
                     quarters: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, float]:
    """Flat ``learning/...`` figures: accuracies beside chance, quarters per stage and reward."""
    out: dict[str, float] = {f"{PREFIX}/accuracy/chance": chance}
    for label, value in accuracies.items():
        if value is not None:
            out[f"{PREFIX}/accuracy/{label}"] = float(value)
    for stage, rewards in quarters.items():
        for reward, stats in rewards.items():
            for which in ("first", "last"):
                value = stats.get(which)
                if isinstance(value, (int, float)):
                    out[f"{PREFIX}/{stage}/{reward}/{which}_quarter"] = float(value)
    return out


def render_learning(figures: Mapping[str, float], stages: Sequence[str], has_curves: bool) -> str:
    lines = ["", "## Learning", "", "Test accuracy (overall) of the policy at each phase, beside chance:", "",
             "| policy | accuracy |", "|---|---|"]
    for label in ("untrained", "warmstart", "trained", "chance"):
        value = figures.get(f"{PREFIX}/accuracy/{label}")
        if value is not None:
            lines.append(f"| {label} | {100 * value:.1f} % |")
    lines += ["", "Mean reward per training stage, first and last quarter of its steps:", "",
              "| stage | reward | first quarter | last quarter |", "|---|---|---|---|"]
    for stage in stages:
        for key in sorted(k for k in figures if k.startswith(f"{PREFIX}/{stage}/") and k.endswith("/first_quarter")):
            reward = key.split("/")[2]
            last = figures.get(key.replace("first_quarter", "last_quarter"))
            lines.append(f"| {stage} | {reward} | {figures[key]:.3f} | {'' if last is None else f'{last:.3f}'} |")
    if has_curves:
        lines += ["", f"![reward curves]({CURVES_PNG})"]
    return "\n".join(lines) + "\n"


def write_learning(work: Path, records: Sequence[Mapping[str, Any]], metrics: Mapping[str, float],
                   baselines: Mapping[str, str], training: Mapping[str, str]) -> dict[str, float]:
    """Write the learning section into ``work/report.md`` and ``reward_curves.png``; return
    the figures for the stage summary."""
    accuracies: dict[str, float | None] = {}
    for label, folder in baselines.items():
        summary_path = Path(folder) / "summary.json"
        accuracies[label] = read_json(summary_path).get(ACCURACY) if summary_path.is_file() else None
    accuracies["trained"] = metrics.get(ACCURACY)
    quarters = {}
    for stage, folder in training.items():
        summary_path = Path(folder) / "summary.json"
        if summary_path.is_file():
            quarters[stage.removeprefix("train_")] = read_json(summary_path).get("quarters") or {}
    figures = learning_figures(accuracies, chance_accuracy(records), quarters)
    has_curves = plot_reward_curves(training, work / CURVES_PNG) is not None
    report = work / "report.md"
    text = report.read_text() if report.is_file() else ""
    report.write_text(text + render_learning(figures, list(quarters), has_curves))
    return figures
