"""The learning figures of a run: test accuracy before training, after the warm start and after
GRPO beside chance (95 % intervals), the verdict they support, each training stage's first-
and last-quarter rewards, and the reward curves of all stages (``reward_curves.png``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from embodied_r.io import read_json
from embodied_r.scoring.paired import PairedResult, format_paired, paired_test
from embodied_r.tracking.names import EXPLORATION, LENGTH, trainer_metric_name
from embodied_r.scoring.metrics import (
    CI_HIGH,
    CI_LOW,
    chance_accuracy,
    chance_interval,
    format_accuracy,
    format_interval,
    guess_chance,
    summary_interval,
)

CURVES_PNG = "reward_curves.png"
PREFIX = "learning"
HISTORY_FILE = "history.json"  # written by the GRPO trainer (training.learning.HISTORY_FILE)
ACCURACY = "accuracy/overall"
PHASES = ("untrained", "warmstart", "trained", "chance")
PAIRED = f"{PREFIX}/paired"  # the GRPO-trained policy against the one it started from
PREDICTIONS_FILE = "predictions.parquet"
PHASE_NAMES = {"untrained": "untrained", "warmstart": "warm-started", "trained": "GRPO-trained", "chance": "chance"}


def _series(history: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(int(e["step"]), float(e[key])) for e in history
            if isinstance(e.get("step"), int) and isinstance(e.get(key), (int, float))
            and not isinstance(e.get(key), bool) and math.isfinite(e[key])]


def reward_curves(training: Mapping[str, str]) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[str, int]]]:
    """Each reward (and ``LENGTH``) over the steps of all stages on one global step axis, and where
    each stage starts; stages without a history are skipped."""
    curves: dict[str, list[tuple[int, float]]] = {}
    starts: list[tuple[str, int]] = []
    offset = 0
    for stage, folder in training.items():
        path = Path(folder) / HISTORY_FILE
        if not path.is_file():
            continue
        data = read_json(path)
        history = data.get("history", [])
        keys = {"reward": "reward", **{n: f"rewards/{n}/mean" for n in data.get("reward_funcs", [])}, **LENGTH}
        # The trainer's own global step (it counts the warm start's steps too), so the figure's
        # step numbers are MLflow's; a stage without it goes on where the last one stopped.
        summary = Path(folder) / "summary.json"
        known = read_json(summary).get("global_step_offset") if summary.is_file() else None
        offset = int(known) if isinstance(known, int) and not isinstance(known, bool) else offset
        starts.append((stage, offset))
        last = offset
        for name, key in keys.items():
            for step, value in _series(history, key):
                curves.setdefault(name, []).append((offset + step, value))
                last = max(last, offset + step)
        offset = last
    return curves, starts


def curve_metric(name: str) -> str:
    """The MLflow metric of a curve (``reward`` or a reward function's name): the figure's legend
    and the parent run's charts use the names of the training runs' own charts."""
    if name in LENGTH:
        return trainer_metric_name(LENGTH[name])
    return trainer_metric_name("reward" if name == "reward" else f"rewards/{name}/mean")


def plot_reward_curves(training: Mapping[str, str], path: Path) -> Path | None:
    curves, starts = reward_curves(training)
    # Rewards share the 0..1 axis; the length in tokens does not (it is its own MLflow chart).
    curves = {name: points for name, points in curves.items() if name not in LENGTH}
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10.5, 4.5))
    for name, points in curves.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, label=curve_metric(name), linewidth=2.2 if name == "reward" else 1.3)
    for stage, start in starts:
        ax.axvline(start, color="grey", linestyle=":", linewidth=1)
        ax.text(start, 1.02, stage, transform=ax.get_xaxis_transform(), fontsize=8)
    ax.set_xlabel("global training step (as in MLflow)")
    ax.set_ylabel("mean reward of the step's completions")
    ax.set_ylim(-0.05, 1.05)
    # Beside the axes, never over the last points.
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def learning_figures(accuracies: Mapping[str, float | None], chance: float,
                     quarters: Mapping[str, Mapping[str, Mapping[str, Any]]],
                     intervals: Mapping[str, tuple[float, float] | None] | None = None) -> dict[str, float]:
    """Flat ``learning/...`` figures: accuracies beside chance, each with its 95 % interval
    (``..._ci_low``, ``..._ci_high``; chance's is the range a guesser lands in), and quarters."""
    out: dict[str, float] = {f"{PREFIX}/accuracy/chance": chance}
    for label, value in accuracies.items():
        if value is not None:
            out[f"{PREFIX}/accuracy/{label}"] = float(value)
    for label, span in (intervals or {}).items():
        if span is not None and f"{PREFIX}/accuracy/{label}" in out:
            out[f"{PREFIX}/accuracy/{label}{CI_LOW}"], out[f"{PREFIX}/accuracy/{label}{CI_HIGH}"] = map(float, span)
    for stage, rewards in quarters.items():
        for reward, stats in rewards.items():
            for which in ("first", "last"):
                value = stats.get(which)
                if isinstance(value, (int, float)):
                    out[f"{PREFIX}/{stage}/{reward}/{which}_quarter"] = float(value)
    return out


def accuracy_lines(figures: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(phase name, its accuracy as text) for each phase there, in training order: the accuracy
    with its 95 % interval; chance with the range a uniform guesser's accuracy lands in."""
    lines = []
    for label in PHASES:
        key = f"{PREFIX}/accuracy/{label}"
        value = figures.get(key)
        if not isinstance(value, (int, float)):
            continue
        span = summary_interval(figures, key)
        if label == "chance":
            text = format_accuracy(value) + ("" if span is None else f" (a guesser lands in {format_interval(span)})")
        else:
            text = format_accuracy(value, span)
        lines.append((PHASE_NAMES[label], text))
    return lines


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def learning_verdict(trained: float, chance: float, start: float | None = None,
                     start_name: str = "the warm-started policy", trained_low: float | None = None,
                     paired: PairedResult | None = None) -> str:
    """One sentence on what the GRPO-trained accuracy shows beside chance and the policy GRPO
    started from (``start``; None when not evaluated). Learning is claimed only when it beats
    both: chance by the low end of its 95 % interval, the start by the ``paired`` test (p < 0.05)
    or, without it, by that low end too (the start's figure taken as exact: a floor, not a proof)."""
    short = [(name, value) for name, value in (("chance", chance), (start_name, start))
             if value is not None and not trained > value]
    if short:
        where = " and ".join(f"{'below' if trained < value else 'no higher than'} {name} ({_pct(value)})"
                             for name, value in short)
        tail = ("no learning shown at this seed" if short[0][0] == "chance"
                else "no gain from GRPO shown at this seed")
        return f"The GRPO-trained reasoner scores {_pct(trained)}, {where}: {tail}."
    above = f"chance ({_pct(chance)})" + ("" if start is None else f" and {start_name} ({_pct(start)})")
    same = "" if paired is None or start is None else (
        f"; on the same {paired.n} questions, paired against {start_name}: {format_paired(paired)}")
    bar = chance if paired is not None else max(chance, start if start is not None else chance)
    if trained_low is not None and not trained_low > bar:
        return (f"The GRPO-trained reasoner scores {_pct(trained)}, above {above}{same}, but the low end of its "
                f"95 % interval ({_pct(trained_low)}) is not: too few questions to say it learned at this seed.")
    if paired is not None and start is not None and not paired.significant:
        return (f"The GRPO-trained reasoner scores {_pct(trained)}, above {above}{same}: not significant, "
                "so no gain from GRPO shown at this seed.")
    return (f"The GRPO-trained reasoner scores {_pct(trained)}, above {above}{same}: "
            "the method learned at this seed.")


def start_label(labels: Sequence[str] | Mapping[str, Any]) -> str:
    """The policy GRPO started from: the warm-started one, or in a recipe without a warm start
    the untrained one."""
    return "warmstart" if "warmstart" in labels else "untrained"


def verdict_of(figures: Mapping[str, Any]) -> str | None:
    """``learning_verdict`` of a run's figures, paired when they hold the paired test; None without
    a trained accuracy."""
    trained = figures.get(f"{PREFIX}/accuracy/trained")
    if not isinstance(trained, (int, float)):
        return None
    start = start_label([k.removeprefix(f"{PREFIX}/accuracy/") for k in figures])
    span = summary_interval(figures, f"{PREFIX}/accuracy/trained")
    return learning_verdict(float(trained), float(figures.get(f"{PREFIX}/accuracy/chance", 0.0)),
                            figures.get(f"{PREFIX}/accuracy/{start}"),
                            f"the {PHASE_NAMES[start]} policy", None if span is None else span[0],
                            PairedResult.from_figures(figures, PAIRED))


def learning_table(figures: Mapping[str, Any]) -> list[str]:
    """Markdown lines of the learning figures (none when the run has none)."""
    phases = accuracy_lines(figures)
    if not phases:
        return []
    lines = ["| policy | accuracy [95 % interval] |", "|---|---|"]
    lines += [f"| {name} | {text} |" for name, text in phases]
    verdict = verdict_of(figures)
    signatures = [f"- {line}" for line in failure_signatures(figures)]
    return lines + (["", f"**{verdict}**"] if verdict else []) + ([""] + signatures if signatures else [])


# The method's failure signatures and its advice for each. The consistency floor is its figure;
# "rising" and "falling" are read from first- and last-quarter means, which single noisy
# steps do not move.
CONSISTENCY_FLOOR = 0.80
HACKING_ADVICE = "raise the consistency reward's weight or inspect the cases (reward hacking)"
MEMORISING_ADVICE = "strengthen the process reward (memorising)"


def _consistent_share(quarter: Mapping[str, Any], which: str) -> tuple[float, float] | None:
    """(accuracy reward, share of right answers the reference reaches from their reasoning)
    in one quarter of a stage: the training consistency reward is paid only for right
    answers, so its mean over the accuracy reward's is the consistent share of those."""
    acc = (quarter.get("accuracy_reward") or {}).get(which)
    cons = (quarter.get("consistency_reward") or {}).get(which)
    if not isinstance(acc, (int, float)) or not isinstance(cons, (int, float)) or acc <= 0:
        return None
    return float(acc), min(1.0, float(cons) / float(acc))


def stage_signatures(stage: str, quarters: Mapping[str, Any]) -> list[str]:
    """One line per failure signature of a training stage's reward quarters: the consistent share of
    right answers under 80 % in the last quarter; the accuracy reward rising while that share
    falls. A stage without a consistency reward shows neither."""
    first, last = _consistent_share(quarters, "first"), _consistent_share(quarters, "last")
    if last is None:
        return []
    lines = []
    if last[1] < CONSISTENCY_FLOOR:
        lines.append(f"Failure signature, {stage}: the reference reaches {_pct(last[1])} of the right answers "
                     f"from their reasoning in the last quarter, under {_pct(CONSISTENCY_FLOOR)}: "
                     f"{HACKING_ADVICE}.")
    if first is not None and last[0] > first[0] and last[1] < first[1]:
        lines.append(f"Failure signature, {stage}: the accuracy reward rose ({_pct(first[0])} -> {_pct(last[0])}) "
                     f"while the consistent share of right answers fell ({_pct(first[1])} -> {_pct(last[1])}): "
                     f"{MEMORISING_ADVICE}.")
    return lines


def training_signatures(stage_name: str, summary: Mapping[str, Any]) -> list[str]:
    """``stage_signatures`` of a training stage (``train_stage2``) from its ``summary.json``;
    none for a stage without reward quarters."""
    quarters = summary.get("quarters")
    return stage_signatures(stage_name.removeprefix("train_"), quarters) if isinstance(quarters, Mapping) else []


def failure_signatures(figures: Mapping[str, Any]) -> list[str]:
    """One line per failure signature (its name, figures and advice): the evaluation's judged
    consistency ratio under 80 %, then each training stage's (``stage_signatures``)."""
    lines = []
    ratio = figures.get("consistency/ratio")
    if isinstance(ratio, (int, float)) and ratio < CONSISTENCY_FLOOR:
        lines.append(f"Failure signature, evaluation: the judge reaches {_pct(ratio)} of the answers from their "
                     f"reasoning, under {_pct(CONSISTENCY_FLOOR)}: {HACKING_ADVICE}.")
    for stage in learning_stages(figures):
        quarters: dict[str, dict[str, Any]] = {}
        for key in figures:
            parts = key.split("/")
            if len(parts) == 4 and parts[:2] == [PREFIX, stage] and parts[3] in ("first_quarter", "last_quarter"):
                quarters.setdefault(parts[2], {})[parts[3].removesuffix("_quarter")] = figures[key]
        lines += stage_signatures(stage, quarters)
    return lines


def learning_stages(figures: Mapping[str, Any]) -> list[str]:
    """The training stages whose reward quarters are among the figures, in order."""
    return sorted({k.split("/")[1] for k in figures if k.startswith(f"{PREFIX}/") and k.endswith("_quarter")})


def learning_block(figures: Mapping[str, Any]) -> list[str]:
    """The console's learning block; no lines without learning figures."""
    phases = accuracy_lines(figures)
    if not phases:
        return []
    out = ["", "Learning (test accuracy [95 % interval]):"] + [f"  {name:14s} {text}" for name, text in phases]
    verdict = verdict_of(figures)
    out += ([verdict] if verdict else []) + failure_signatures(figures)
    for stage in learning_stages(figures):
        rewards, exploring, lengths = [], [], []
        for key in sorted(k for k in figures if k.startswith(f"{PREFIX}/{stage}/") and k.endswith("first_quarter")):
            name, last = key.split("/")[2], figures.get(key.replace("first_quarter", "last_quarter"))
            if name == "entropy":
                exploring.append(f"entropy {figures[key]:.2f} -> {'-' if last is None else f'{last:.2f}'}")
            elif name in LENGTH:
                lengths.append(f"{figures[key]:.0f} -> {'-' if last is None else f'{last:.0f}'} tokens")
            else:
                end = "-" if last is None else f"{100 * last:.1f}"
                label = "groups all scored alike" if name == "zero_std_groups" else name
                (exploring if name in EXPLORATION else rewards).append(f"{label} {100 * figures[key]:.1f} -> {end} %")
        out.append(f"  {stage:8s} mean reward, first -> last quarter: {', '.join(rewards)}")
        if exploring:
            out.append(f"  {'':8s} exploration, first -> last quarter: {', '.join(exploring)}")
        if lengths:
            out.append(f"  {'':8s} response length, first -> last quarter: {lengths[0]}")
    return out


def render_learning(figures: Mapping[str, float], stages: Sequence[str], has_curves: bool) -> str:
    lines = ["", "## Learning", "", "Test accuracy (overall) of the policy at each phase, with its 95 % interval, "
             "beside chance:", ""]
    lines += learning_table(figures)
    lines += ["", "Mean reward per training stage, first and last quarter of its steps (with how much it still "
              "explores: the share of groups whose completions all scored alike, and the completions' entropy):", "",
              "| stage | figure | first quarter | last quarter |", "|---|---|---|---|"]
    for stage in stages:
        for key in sorted(k for k in figures if k.startswith(f"{PREFIX}/{stage}/") and k.endswith("/first_quarter")):
            reward = key.split("/")[2]
            last = figures.get(key.replace("first_quarter", "last_quarter"))
            lines.append(f"| {stage} | {reward} | {figures[key]:.3f} | {'' if last is None else f'{last:.3f}'} |")
    if has_curves:
        lines += ["", f"![reward curves]({CURVES_PNG})"]
    return "\n".join(lines) + "\n"


def _scores(folder: Path) -> dict[str, float]:
    import pyarrow.parquet as pq

    path = folder / PREDICTIONS_FILE
    if not path.is_file():
        return {}
    table = pq.read_table(path, columns=["uid", "score"]).to_pydict()
    return dict(zip(table["uid"], table["score"]))


def paired_against(start: Path, trained: Path) -> PairedResult | None:
    """The trained policy's scores (``trained/predictions.parquet``) against the starting
    policy's on the questions both folders hold (a failed answer is a row scoring 0, so both
    hold the whole split); None when either has no predictions."""
    base, other = _scores(start), _scores(trained)
    both = [uid for uid in other if uid in base]
    if not both:
        return None
    return paired_test([base[u] for u in both], [other[u] for u in both])


def write_learning(work: Path, records: Sequence[Mapping[str, Any]], metrics: Mapping[str, float],
                   baselines: Mapping[str, str], training: Mapping[str, str]) -> dict[str, float]:
    """Write the learning section into ``work/report.md`` and ``reward_curves.png``; return
    the figures for the stage summary."""
    accuracies: dict[str, float | None] = {}
    intervals: dict[str, tuple[float, float] | None] = {}
    for label, folder in baselines.items():
        summary_path = Path(folder) / "summary.json"
        summary = read_json(summary_path) if summary_path.is_file() else {}
        accuracies[label], intervals[label] = summary.get(ACCURACY), summary_interval(summary, ACCURACY)
    accuracies["trained"], intervals["trained"] = metrics.get(ACCURACY), summary_interval(metrics, ACCURACY)
    intervals["chance"] = chance_interval([guess_chance(r) or 0.0 for r in records])
    quarters = {}
    for stage, folder in training.items():
        summary_path = Path(folder) / "summary.json"
        if summary_path.is_file():
            quarters[stage.removeprefix("train_")] = read_json(summary_path).get("quarters") or {}
    figures = learning_figures(accuracies, chance_accuracy(records), quarters, intervals)
    start = start_label(baselines) if baselines else None
    if start is not None and (paired := paired_against(Path(baselines[start]), work)) is not None:
        figures.update(paired.figures(PAIRED))
    has_curves = plot_reward_curves(training, work / CURVES_PNG) is not None
    report = work / "report.md"
    text = report.read_text() if report.is_file() else ""
    report.write_text(text + render_learning(figures, list(quarters), has_curves))
    return figures
