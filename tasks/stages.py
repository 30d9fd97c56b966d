"""One Prefect task per stage kind, with the retries its ``stage_kinds`` entry declares.

Tasks pass stage plans, never data; a complete stage folder is the one record of "done" (the
task ends ``Cached``), so Prefect keeps no cache or result of its own."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Protocol

from prefect import Task, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, State

from embodied_r import progress
from embodied_r.evaluation.learning import training_signatures
from embodied_r.errors import DiskFull, WriteFailure, disk_full, full_path, may_pass
from embodied_r.paths import disk_full_line, home, home_line, in_home, refused
from embodied_r.io import partial_path, read_summary
from embodied_r.pipeline import StagePlan, execute
from embodied_r.stage_kinds import KINDS, kind_of


class Observer(Protocol):
    """Who the run loop tells what happens (``embodied_r.tracking.record.Recorder`` keeps it in
    MLflow); ``stage_started`` gives the id the stage's own record is kept under, for its runner."""

    environment: dict[str, str]  # what the stages' own processes need to report as it does

    def run_started(self, selected: list[str], refreshed: list[str], chosen: bool) -> None: ...

    def blocked(self, sp: StagePlan) -> str: ...

    def stage_started(self, sp: StagePlan) -> str | None: ...

    def stage_finished(self, sp: StagePlan, run_id: str | None, summary: dict[str, Any],
                       signatures: list[str]) -> None: ...

    def stage_failed(self, sp: StagePlan, run_id: str | None) -> None: ...

    def stage_cached(self, sp: StagePlan, summary: dict[str, Any], signatures: list[str]) -> str: ...

    def run_finished(self, cached: list[str] | None, final: StagePlan | None = None) -> dict[str, Any]: ...


def _round(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 3) if abs(value) < 100 else round(value, 1)
    return value


def short_summary(kind: str, summary: dict[str, Any], limit: int = 12) -> dict[str, Any]:
    """At most ``limit`` headline figures of a stage's summary, rounded: its kind's own
    figures first (``StageKind.figures``); the full summary is in summary.json and MLflow."""
    picked = {k: _round(summary[k]) for k in kind_of(kind).figures if k in summary}
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
    rows = "\n".join(f"| {k} | {v} |" for k, v in short_summary(sp.kind, summary).items())
    return (f"### {sp.name}\n\nOutput: `{sp.out}` (full figures in `summary.json` and in MLflow)\n\n"
            f"| figure | value |\n|---|---|\n{rows}\n")


def _announce(sp: StagePlan, event: str, seconds: float | None = None, note: str = "") -> None:
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


def _payload(sp: StagePlan, run_id: str | None, summary: dict[str, Any]) -> dict[str, Any]:
    return {"stage": sp.name, "out": sp.out, "mlflow_run_id": run_id,
            "summary": json.loads(json.dumps(summary, default=str))}


def run_stage(stage: dict[str, Any], observer: Observer | None = None) -> dict[str, Any] | State:
    """Run one stage, telling ``observer`` it started and how it ended; returns where its output is.
    A complete folder runs nothing: the task ends ``Cached`` with the stored summary."""
    sp = StagePlan.from_dict(stage)
    if sp.complete:
        return Completed(name="Cached", data=_payload(sp, None, read_summary(Path(sp.out))))
    run_id = observer.stage_started(sp) if observer is not None else None
    _announce(sp, "started")
    progress.begin(sp.name, kind_of(sp.kind).unit)
    started = time.monotonic()
    try:
        with progress.listening(progress.Throttled(_ProgressArtifact(sp.name), seconds=2.0)):
            summary = execute(sp, mlflow_run_id=run_id)
    except BaseException as exc:
        full = disk_full(exc)
        unwritable = None if full else refused(exc)
        if unwritable is not None and not in_home(unwritable.filename):
            unwritable = None
        _announce(sp, "failed", time.monotonic() - started,
                  "disk full" if full else "home not writable" if unwritable else type(exc).__name__)
        if observer is not None:
            observer.stage_failed(sp, run_id)
        if full and not isinstance(exc, DiskFull):
            raise DiskFull(_disk_full_line(sp, exc)) from exc
        if unwritable is not None:
            # A StageFault: not retried (the home stays read-only a moment later) and the
            # folder stays .partial, so the rerun resumes it.
            raise WriteFailure(f"{sp.name}: {home_line(home(), unwritable)}; the stage's work so far is kept "
                               f"in {partial_path(Path(sp.out)).name} and the rerun resumes it") from exc
        raise
    signatures = training_signatures(sp.name, summary)
    if observer is not None:
        observer.stage_finished(sp, run_id, summary, signatures)
    _announce(sp, "done", time.monotonic() - started,
              "; ".join(part for part in ((_headline(sp.kind, summary) + _kept(sp.kind, summary)).strip(),
                                          _left_out(sp, summary)) if part))
    say_signatures(signatures)
    try:
        create_markdown_artifact(_markdown(sp, summary), key=f"{sp.name.replace('_', '-')}-summary",
                                 description=f"{sp.name} summary")
        if sp.kind == "evaluate":
            from embodied_r.evaluation.report import table_rows_from_folder

            create_table_artifact(table=table_rows_from_folder(Path(sp.out)), key="evaluate-accuracy",
                                  description="Accuracy per task beside the paper's Embodied-R (Table 1)")
    except Exception:  # noqa: BLE001 - artifacts are a convenience, not part of the result
        pass
    return _payload(sp, run_id, summary)


def say_signatures(lines: list[str]) -> None:
    """Each failure signature on the terminal and as a warning in Prefect's log, as a training stage
    ends: a run going wrong is seen after its first stage, not its last."""
    for line in lines:
        progress.say(line)
        try:
            get_run_logger().warning(line)
        except Exception:  # noqa: BLE001 - outside a flow run
            pass


def _disk_full_line(sp: StagePlan, exc: BaseException) -> str:
    """A full disk met by a stage, in one line: the folder it was writing (its ``.partial`` folder
    when inside it), what is free, and the fix; the folder stays ``.partial`` for the rerun."""
    partial = partial_path(Path(sp.out))
    written = Path(full_path(exc) or partial)
    folder = partial if written == partial or partial in written.parents else written.parent
    return (f"{disk_full_line(sp.name, folder)}; the stage's work so far is kept in {partial.name} "
            "and the rerun resumes it")


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


def _headline(kind: str, summary: dict[str, Any]) -> str:
    """The one figure worth a glance on a stage's done line, as its kind declares
    (``StageKind.headline``); items done and failed when its summary lacks that figure."""
    headline = kind_of(kind).headline
    if headline == "accuracy" and isinstance(summary.get("accuracy/overall"), (int, float)):
        from embodied_r.scoring.metrics import format_accuracy, summary_interval

        accuracy = format_accuracy(summary["accuracy/overall"], summary_interval(summary, "accuracy/overall"))
        return f"accuracy {accuracy} on {summary.get('count/overall', 0):.0f} questions"
    if headline == "training" and "steps" in summary and "stopped_by" in summary:
        return f"{summary['steps']} steps, epoch {summary.get('epochs_reached', 0):.2f}, stopped by {summary['stopped_by']}"
    failed = summary.get("failed")
    done = summary.get("done")
    return f"{done} done, {failed} failed" if isinstance(done, int) and isinstance(failed, int) else ""


def _kept(kind: str, summary: dict[str, Any]) -> str:
    """What a resumed stage kept of the run it resumes: the items of its log, or the steps of a
    trainer's checkpoint."""
    count = progress.kept() or summary.get("resumed_from_step")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        return ""
    return f" ({count} {kind_of(kind).unit} kept from the interrupted run)"


def _worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """Only a failure that may pass is retried (``errors.may_pass``, one rule for every stage)."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - the table decides
        return may_pass(exc)
    return True


def _task(name: str, retries: int, retry_delay_s: int) -> Task:
    # No cache policy and no stored result: the stage folder is the one record of done.
    return task(run_stage, name=name, retries=retries, retry_delay_seconds=retry_delay_s,
                retry_condition_fn=_worth_retrying, cache_policy=NO_CACHE, persist_result=False)


class _Tasks(dict[str, Task]):
    """One Prefect task per stage kind, made when first asked for."""

    def __missing__(self, name: str) -> Task:
        kind = kind_of(name)
        made = self[name] = _task(kind.name, kind.retries, kind.retry_delay_s)
        return made


STAGE_TASKS = _Tasks({k.name: _task(k.name, k.retries, k.retry_delay_s) for k in KINDS})
