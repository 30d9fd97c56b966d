"""Learning figures from a trainer's log history: does a stage raise the rewards it weights (an SFT
run: its token accuracy), comparing last-quarter to first-quarter means (single steps are too noisy)."""

from __future__ import annotations

import math
from typing import Any, Iterable

from embodied_r.tracking.names import EXPLORATION, LENGTH

HISTORY_FILE = "history.json"
QUARTER = 0.25


def reward_series(history: Iterable[dict[str, Any]], reward_names: Iterable[str]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of the total reward, each named reward, ``EXPLORATION`` and ``LENGTH``, one per
    logged step; an entry without a finite value is skipped for that series only."""
    keys = {"reward": "reward", **{name: f"rewards/{name}/mean" for name in reward_names}, **EXPLORATION, **LENGTH}
    series: dict[str, list[tuple[int, float]]] = {name: [] for name in keys}
    for entry in history:
        step = entry.get("step")
        if not isinstance(step, int):
            continue
        for name, key in keys.items():
            value = entry.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                series[name].append((step, float(value)))
    return series


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def first_last(values: list[float], fraction: float = QUARTER) -> tuple[float | None, float | None]:
    """Means of the first and of the last ``fraction`` of ``values`` (each at least one value;
    None, None for none): single steps are too noisy to say whether a stage learned."""
    k = max(1, math.ceil(len(values) * fraction)) if values else 0
    return _mean(values[:k]), _mean(values[-k:] if k else [])


def quarter_stats(history: Iterable[dict[str, Any]], reward_names: Iterable[str],
                  fraction: float = QUARTER) -> dict[str, dict[str, float | None]]:
    """Per reward: mean over the first and the last ``fraction`` of its logged steps (at least one
    step each, so under two steps they coincide; ``steps`` says how many there were)."""
    if not 0 < fraction <= 0.5:
        raise ValueError(f"fraction must be in (0, 0.5], got {fraction}")
    out: dict[str, dict[str, float | None]] = {}
    for name, points in reward_series(history, reward_names).items():
        values = [v for _, v in sorted(points)]
        first, last = first_last(values, fraction)
        out[name] = {"first": first, "last": last, "steps": float(len(values)),
                     "change": (last - first) if first is not None and last is not None else None}
    return out


def _last(history: list[dict[str, Any]], key: str) -> float | None:
    for entry in reversed(history):
        value = entry.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def _history_mean(history: list[dict[str, Any]], key: str) -> float | None:
    return _mean([float(e[key]) for e in history if isinstance(e.get(key), (int, float)) and math.isfinite(e[key])])


def result_figures(history: list[dict[str, Any]], reward_names: list[str]) -> dict[str, Any]:
    """Final and stage-mean figures from the trainer's log history."""
    out: dict[str, Any] = {}
    keys = ["reward", "kl", "loss", "completions/mean_length", "completions/clipped_ratio"]
    keys += [f"rewards/{name}/mean" for name in reward_names]
    for key in keys:
        name = key.replace("/", "_")
        last, mean = _last(history, key), _history_mean(history, key)
        if last is not None:
            out[f"final_{name}"] = last
        if mean is not None:
            out[f"mean_{name}"] = mean
    return out


def schedule_figures(state: Any, epochs: float, step_cap: int | None, offset: int) -> dict[str, Any]:
    """How far the stage went: epochs asked for and reached, and whether a step cap ended it."""
    steps = int(state.global_step)
    reached = float(state.epoch or 0.0)
    capped = bool(step_cap) and steps >= int(step_cap) and reached + 1e-6 < float(epochs)
    return {"epochs_requested": float(epochs), "epochs_reached": round(reached, 4),
            "step_cap": step_cap or 0, "stopped_by": "step cap" if capped else "epochs",
            "global_step_offset": offset, "global_step_end": offset + steps}


def logged_quarters(history: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    """Mean of ``key`` over the first and the last quarter of the logged steps (the closing
    summary entry left out)."""
    values = [float(e[key]) for e in history if isinstance(e.get(key), (int, float)) and "train_runtime" not in e]
    first, last = first_last(values)
    return {"first": first, "last": last, "steps": len(values)}


def sft_figures(history: list[dict[str, Any]]) -> dict[str, Any]:
    """An SFT run's token accuracy and loss, first and last quarter, and the highest learning
    rate logged (about the one set when the run left its warm-up; far below it when it never did)."""
    rates = [float(e["learning_rate"]) for e in history if isinstance(e.get("learning_rate"), (int, float))]
    return {"token_accuracy": logged_quarters(history, "mean_token_accuracy"),
            "loss": logged_quarters(history, "loss"), "peak_learning_rate": max(rates) if rates else None}
