"""One Prefect task per pipeline stage.

Tasks pass stage plans (paths and small configs), never data. The cache key is the
task's inputs (the stage plan: config, input folders and an output folder named by the
stage's own hash) plus the task's source plus the source of the library modules the
stage runs; the MLflow tracker is left out of the key.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy

from embodied_r import progress
from embodied_r.pipeline import StagePlan, execute
from embodied_r.runners import code_version
from embodied_r.tracking import Tracker, record_stage


def _code_key(context: Any, parameters: dict[str, Any]) -> str:
    return code_version(parameters["stage"]["kind"])


STAGE_CACHE = (INPUTS - "tracker") + TASK_SOURCE + CacheKeyFnPolicy(cache_key_fn=_code_key)


# The figures a stage's Prefect summary shows, in this order, when present; the full
# summary is in summary.json and in MLflow.
SUMMARY_KEYS = ("items", "videos", "done", "failed", "keyframes_mean", "questions", "records", "steps",
                "epochs_reached", "stopped_by", "final_reward", "final_rewards_format_reward_mean",
                "final_rewards_accuracy_reward_mean", "final_kl", "accuracy/overall", "accuracy/macro",
                "accuracy/paper_tasks", "count/overall", "split", "seconds", "seconds_per_step")


def _round(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 3) if abs(value) < 100 else round(value, 1)
    return value


def short_summary(summary: dict[str, Any], limit: int = 12) -> dict[str, Any]:
    """At most ``limit`` headline figures of a summary, rounded."""
    picked = {k: _round(summary[k]) for k in SUMMARY_KEYS if k in summary}
    for key, value in summary.items():
        if len(picked) >= limit:
            break
        if key not in picked and "/" not in key and isinstance(value, (int, float)) and not isinstance(value, bool):
            picked[key] = _round(value)
    reasons = summary.get("failure_reasons")
    if reasons:
        picked["failure_reasons"] = ", ".join(f"{k} {v}" for k, v in reasons.items())
    return dict(list(picked.items())[:limit + 1])


def _markdown(sp: StagePlan, summary: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in short_summary(summary).items())
    return (f"### {sp.name}\n\nOutput: `{sp.out}` (full figures in `summary.json` and in MLflow)\n\n"
            f"| figure | value |\n|---|---|\n{rows}\n")


def _announce(sp: StagePlan, event: str, seconds: float | None = None, note: str = "") -> None:
    """One line on the terminal and the same event in Prefect's log."""
    progress.say(progress.stage_line(sp.name, event, seconds, note))
    try:
        get_run_logger().info("%s %s%s%s", sp.name, event, f" in {seconds:.1f} s" if seconds is not None else "",
                              f" ({note})" if note else "")
    except Exception:  # noqa: BLE001 - outside a run there is no Prefect logger
        pass


class _ProgressArtifact:
    """Mirror a stage's item progress into a Prefect progress artifact."""

    def __init__(self, name: str):
        self.name = name
        self.artifact_id = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        percent = 100.0 * done / total if total else 100.0
        if self.artifact_id is None:
            self.artifact_id = create_progress_artifact(
                percent, key=f"{self.name.replace('_', '-')}-progress", description=f"{self.name} progress")
        else:
            update_progress_artifact(self.artifact_id, percent)


def run_stage(stage: dict[str, Any], tracker: Tracker | None = None) -> dict[str, Any]:
    """Run one stage under its own MLflow child run; returns where its output is."""
    sp = StagePlan.from_dict(stage)
    run_id = None
    if tracker is not None:
        run_id = tracker.start_stage(sp.name, sp.params, tags={"stage_key": sp.key, "output": sp.out})
    _announce(sp, "started")
    progress.begin(sp.name)
    started = time.monotonic()
    try:
        with progress.listening(progress.Throttled(_ProgressArtifact(sp.name), seconds=2.0)):
            summary = execute(sp, mlflow_run_id=run_id)
    except BaseException as exc:
        _announce(sp, "failed", time.monotonic() - started, type(exc).__name__)
        if run_id:
            tracker.finish(run_id, "FAILED")
        raise
    if run_id:
        record_stage(tracker, run_id, Path(sp.out), summary, sp.kind)
        tracker.finish(run_id)
    _announce(sp, "done", time.monotonic() - started,
              "; ".join(part for part in (_headline(summary), _left_out(sp, summary)) if part))
    try:
        create_markdown_artifact(_markdown(sp, summary), key=f"{sp.name.replace('_', '-')}-summary",
                                 description=f"{sp.name} summary")
        if sp.kind == "evaluate":
            from embodied_r.evaluation.report import table_rows_from_folder

            create_table_artifact(table=table_rows_from_folder(Path(sp.out)), key="evaluate-accuracy",
                                  description="Accuracy per task beside the paper's Embodied-R (Table 1)")
    except Exception:  # noqa: BLE001 - artifacts are a convenience, not part of the result
        pass
    return {"stage": sp.name, "out": sp.out, "mlflow_run_id": run_id,
            "summary": json.loads(json.dumps(summary, default=str))}


def _left_out(sp: StagePlan, summary: dict[str, Any]) -> str:
    """How many items the stage left out, why and where they are listed: a stage that goes
    on past bad items must say so where the user looks."""
    failed = summary.get("failed")
    listed = Path(sp.out) / "failures.parquet"
    if not isinstance(failed, int) or isinstance(failed, bool) or failed <= 0 or not listed.is_file():
        return ""
    reasons = summary.get("failure_reasons") or summary.get("reasons") or {}
    why = f" ({', '.join(f'{k} {v}' for k, v in reasons.items())})" if isinstance(reasons, dict) and reasons else ""
    return f"{failed} left out{why}, listed in {listed}"


def _headline(summary: dict[str, Any]) -> str:
    """The one figure worth a glance on a stage's done line."""
    if isinstance(summary.get("accuracy/overall"), (int, float)):
        from embodied_r.scoring.metrics import format_accuracy, summary_interval

        accuracy = format_accuracy(summary["accuracy/overall"], summary_interval(summary, "accuracy/overall"))
        return f"accuracy {accuracy} on {summary.get('count/overall', 0):.0f} questions"
    if "steps" in summary and "stopped_by" in summary:
        return f"{summary['steps']} steps, epoch {summary.get('epochs_reached', 0):.2f}, stopped by {summary['stopped_by']}"
    failed = summary.get("failed")
    done = summary.get("done")
    return f"{done} done, {failed} failed" if isinstance(done, int) and isinstance(failed, int) else ""



def _worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """A stage that stopped on purpose (an outage after the backend's own retries, too many
    failed items, a busy lock) fails again at once: retrying only hides it for minutes."""
    from embodied_r.faults import StageFault
    from embodied_r.io import StageBusy

    try:
        state.result()
    except (StageFault, StageBusy):
        return False
    except BaseException:  # noqa: BLE001 - any other failure may be passing
        return True
    return True


_stage_task = task(run_stage, cache_policy=STAGE_CACHE, persist_result=True, retry_condition_fn=_worth_retrying)

# Per-stage options: perception and evaluation call remote models, so one retry of
# the whole stage (which resumes per item) is cheap; training resumes from its checkpoint.
STAGE_TASKS = {
    "download": _stage_task.with_options(name="download", retries=2, retry_delay_seconds=10),
    "preprocess": _stage_task.with_options(name="preprocess"),
    "keyframes": _stage_task.with_options(name="keyframes", retries=1),
    "perception": _stage_task.with_options(name="perception", retries=2, retry_delay_seconds=30),
    "convert": _stage_task.with_options(name="convert"),
    "warmstart": _stage_task.with_options(name="warmstart", retries=1, retry_delay_seconds=30),
    "train": _stage_task.with_options(name="train", retries=1, retry_delay_seconds=30),
    "evaluate": _stage_task.with_options(name="evaluate", retries=1, retry_delay_seconds=30),
}
