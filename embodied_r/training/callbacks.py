"""What a trainer child reports while it trains: per-step MLflow metrics, the step line for the
parent's terminal and (GRPO) a table of sampled completions. TRL's own MLflow callback is not
used: it logs flat names, restarts the step in every stage and renames the run."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from embodied_r.backends.base import completion_text
from embodied_r.errors import TrackingLost
from embodied_r.tracking.names import trainer_metric_name
from embodied_r.tracking.runs import Tracker

log = logging.getLogger("embodied_r.training.callbacks")

TABLE_FILE = "completions.json"
PROMPT_EXCERPT = 400  # characters of the prompt's end (the question) shown in the table
COMPLETION_MAX = 8000
# A trainer child prints ``STEP_MARK {json}`` after each logged step; the parent turns it into
# one compact terminal line (``progress.step_line``) instead of the trainer's raw dict.
STEP_MARK = "[embodied-r step]"


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # a reward left unscored (None) arrives as NaN
    return value


def _excerpt(prompt: Any) -> str:
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else ""
    text = str(prompt or "")
    # The question and options sit at the end; the frame-by-frame text before them is long.
    return text if len(text) <= PROMPT_EXCERPT else "…" + text[-PROMPT_EXCERPT:]


def completion_sample(logs: dict[str, Any], rows: int, step: int) -> dict[str, list[Any]]:
    """The first ``rows`` completions of the latest generation batch (a whole group of
    one prompt when ``rows`` equals the number of generations), with each reward, the
    advantage and the columns rewards logged (parsed answer, solution, reference answer)."""
    prompts = list(logs.get("prompt", []))
    n = min(rows, len(prompts))
    if n <= 0:
        return {}
    table: dict[str, list[Any]] = {
        "step": [step] * n,
        "prompt": [_excerpt(p) for p in prompts[:n]],
        "completion": [completion_text(c)[:COMPLETION_MAX] for c in list(logs["completion"])[:n]],
    }
    for name, values in logs.get("rewards", {}).items():
        table[name] = [_json_value(float(v)) for v in list(values)[:n]]
    if logs.get("advantages"):
        table["advantage"] = [_json_value(float(v)) for v in list(logs["advantages"])[:n]]
    for column, values in logs.get("extra", {}).items():
        table.setdefault(column, [_json_value(v) for v in list(values)[:n]])
    return table


def sampled_steps(max_steps: int, every: int, samples: int = 4) -> set[int]:
    """The steps whose completions go into the table: ``samples`` spread over the stage
    (first and last included), plus every ``every``-th step."""
    if max_steps <= 0:
        return set()
    spread = {max(1, round(1 + i * (max_steps - 1) / max(samples - 1, 1))) for i in range(samples)}
    return spread | set(range(every, max_steps + 1, every)) | {max_steps}


def metric_batch(logs: dict[str, Any]) -> dict[str, float]:
    """A trainer log entry as prefixed MLflow metrics (numbers only, finite)."""
    out = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[trainer_metric_name(key)] = float(value)
    return out


def step_record(metrics: dict[str, float], stage: str, step: int, total: int, global_step: int) -> dict[str, Any]:
    """What the parent prints for one step: the total reward, each component, KL."""
    parts = {k[len("reward/"):]: v for k, v in metrics.items()
             if k.startswith("reward/") and not k.endswith("_std") and k != "reward/total"}
    return {"stage": stage, "step": step, "total": total, "global": global_step,
            "reward": metrics.get("reward/total"), "components": parts, "kl": metrics.get("train/kl")}


def sft_step_record(logs: dict[str, Any], stage: str, step: int, total: int) -> dict[str, Any]:
    """What the parent prints for one SFT step: the loss, the token accuracy, the learning rate."""
    def number(key: str) -> float | None:
        value = logs.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None

    return {"stage": stage, "step": step, "total": total, "loss": number("loss"),
            "token_accuracy": number("mean_token_accuracy"), "lr": number("learning_rate")}


# The prefix of the trainer's own arguments among a run's params, apart from the recipe's.
TRAINER_PARAMS = "trainer"


def trainer_params(arguments: dict[str, Any]) -> dict[str, Any]:
    """A trainer's arguments (``TrainingArguments.to_dict()``) as params under ``trainer.``."""
    return {f"{TRAINER_PARAMS}.{k}": v for k, v in arguments.items()}


# Step figures reach MLflow once per this many seconds and at the end: a store transaction per
# step would cost about what the tiny demo reasoner's whole step costs.
FLUSH_SECONDS = 5.0


class StepMetrics:
    """A trainer's step figures into an MLflow run, sent every ``every_s`` seconds and at ``flush``;
    they wait in the outbox while the server is away, and a refused batch is only a warning."""

    def __init__(self, tracker: Tracker, run_id: str, every_s: float = FLUSH_SECONDS):
        self.tracker, self.run_id, self.every_s = tracker, run_id, every_s
        self.points: list[tuple[dict[str, float], int, float]] = []
        self.sent_at = time.monotonic()

    def add(self, metrics: dict[str, float], step: int) -> None:
        if metrics:
            self.points.append((metrics, step, time.time()))
        if time.monotonic() - self.sent_at >= self.every_s:
            self.flush()

    def flush(self) -> None:
        points, self.points, self.sent_at = self.points, [], time.monotonic()
        if not points:
            return
        try:
            self.tracker.log_steps(self.run_id, points)
        except TrackingLost:
            pass
        except Exception as exc:  # noqa: BLE001 - lost points must not stop training
            log.warning("could not log metrics of steps %d-%d: %s", points[0][1], points[-1][1], exc)


def sft_step_callback(stage: str, run_id: str | None = None, uri: str | None = None) -> Any:
    """A TrainerCallback printing ``STEP_MARK {json}`` per logged SFT step and, with ``run_id``,
    logging its figures (``trainer_metric_name`` groups) and the trainer's arguments as
    ``trainer.`` params; transformers' MLflow callback would rename the run and flatten the names."""
    from transformers import TrainerCallback

    tracker = Tracker(uri, "") if run_id and uri else None
    figures = StepMetrics(tracker, run_id) if tracker is not None else None

    class SFTSteps(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if tracker is None or not state.is_world_process_zero:
                return
            try:
                tracker.log_params(run_id, trainer_params(args.to_dict()))
            except TrackingLost:
                pass
            except Exception as exc:  # noqa: BLE001 - a resumed run logged them already
                log.warning("could not log the trainer's arguments: %s", exc)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if not state.is_world_process_zero or not logs:
                return
            if figures is not None:
                figures.add(metric_batch(logs), int(state.global_step))
            # The end-of-training entry (train_runtime, train_loss) is no step of its own.
            if "loss" not in logs or "train_runtime" in logs:
                return
            record = sft_step_record(logs, stage, int(state.global_step), int(state.max_steps))
            print(STEP_MARK, json.dumps(record), flush=True)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if figures is not None:
                figures.flush()

    return SFTSteps()


def drop_raw_log_printers(trainer: Any) -> None:
    """Remove the callbacks that print each log entry as a raw dict (the printer, and the
    progress bar's own copy): our step callbacks print one compact line instead."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


def _write_table(path: Path, rows: list[dict[str, Any]]) -> Path:
    # The whole table is rewritten at each sample: one file, every sampled step in it.
    columns = list(dict.fromkeys(k for row in rows for k in row))
    data = [[row.get(c) for c in columns] for row in rows]
    path.write_text(json.dumps({"columns": columns, "data": data}, default=str), encoding="utf-8")
    return path


def _log_table(tracker: Tracker, run_id: str, path: Path, step: int) -> bool:
    """Whether the table went into the run; a lost table must not stop training."""
    try:
        tracker.log_table(run_id, path)
        return True
    except TrackingLost:
        return False
    except Exception as exc:  # noqa: BLE001 - a lost table must not stop training
        log.warning("could not log the completions table at step %d: %s", step, exc)
        return False


def reporting_callback(stage: str, stage_index: int, offset: int, run_id: str | None, uri: str | None,
                       table_rows: int, table_every: int, work: Path) -> Any:
    """One callback for the metrics, the step lines and the completions table. Its ``trainer``
    is set once the trainer exists (the table reads the trainer's last generation batch)."""
    from transformers import TrainerCallback

    tracker = Tracker(uri, "") if run_id and uri else None
    figures = StepMetrics(tracker, run_id) if tracker is not None else None

    class Reporting(TrainerCallback):
        def __init__(self) -> None:
            self.trainer: Any = None
            self.rows: list[dict[str, Any]] = []
            self.table_steps: list[int] = []
            self.tables = 0

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if not state.is_world_process_zero or not logs:
                return
            step, total = int(state.global_step), int(state.max_steps)
            metrics = metric_batch(logs)
            is_step = "reward/total" in metrics or "train/loss" in metrics
            if is_step:
                metrics["train/stage"] = float(stage_index)
            if figures is not None:
                figures.add(metrics, offset + step)
            if is_step and "train_runtime" not in logs:
                print(STEP_MARK, json.dumps(step_record(metrics, stage, step, total, offset + step)), flush=True)
                self._sample(step, total)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if figures is not None:
                figures.flush()

        def _sample(self, step: int, total: int) -> None:
            if self.trainer is None or not table_rows or step in self.table_steps:
                return
            if step not in sampled_steps(total, table_every):
                return
            sample = completion_sample(getattr(self.trainer, "_logs", {}), table_rows, step)
            if not sample:
                return
            n = len(sample["step"])
            sample = {"stage": [stage] * n, "global_step": [offset + step] * n, **sample}
            self.rows += [dict(zip(sample, values)) for values in zip(*sample.values())]
            self.table_steps.append(step)
            if tracker is not None and _log_table(tracker, run_id, _write_table(work / TABLE_FILE, self.rows), step):
                self.tables += 1

    return Reporting()
