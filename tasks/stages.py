"""One Prefect task per pipeline stage.

Tasks pass stage plans (paths and small configs), never data. The cache key is the
task's inputs (the stage plan: config, input folders and an output folder named by the
stage's own hash) plus the task's source plus the source of the library modules the
stage runs; the MLflow tracker is left out of the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE, CacheKeyFnPolicy

from embodied_r import progress
from embodied_r.pipeline import StagePlan, execute
from embodied_r.runners import code_version
from embodied_r.tracking import Tracker, record_stage


def _code_key(context: Any, parameters: dict[str, Any]) -> str:
    return code_version(parameters["stage"]["kind"])


STAGE_CACHE = (INPUTS - "tracker") + TASK_SOURCE + CacheKeyFnPolicy(cache_key_fn=_code_key)


def _markdown(sp: StagePlan, summary: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {k} | {v} |" for k, v in summary.items() if not isinstance(v, (dict, list))
    )
    return f"### {sp.name}\n\nOutput: `{sp.out}`\n\n| figure | value |\n|---|---|\n{rows}\n"


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
        run_id = tracker.start_stage(sp.name, sp.config, tags={"stage_key": sp.key, "output": sp.out})
    try:
        with progress.listening(progress.Throttled(_ProgressArtifact(sp.name), seconds=2.0)):
            summary = execute(sp, mlflow_run_id=run_id)
    except BaseException:
        if run_id:
            tracker.finish(run_id, "FAILED")
        raise
    if run_id:
        record_stage(tracker, run_id, Path(sp.out), summary)
        tracker.finish(run_id)
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


_stage_task = task(run_stage, cache_policy=STAGE_CACHE, persist_result=True)

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
