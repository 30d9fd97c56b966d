"""The runs of an experiment: ``Tracker`` opens it and writes runs by explicit id (never MLflow's
global active run, so stages in threads or subprocesses log to the right run), each write
through the process's ``link``; runs whose process died are closed as KILLED."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from embodied_r.paths import artifacts_root, home_lock
from embodied_r.tracking.link import guard, link
from embodied_r.tracking.names import RUN_LIST_VIEW_TAG, run_list_view, safe_params, stage_record
from embodied_r.tracking.outbox import gone, process_name
from embodied_r.tracking.store import check_store, opening

# The experiment kind that makes MLflow 3's UI open an experiment on its run list.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
EXPERIMENT_NOTE = (
    "Embodied-R pipeline runs. Each parent run is one run of a recipe, named by what tells it apart "
    "(fresh, cached or partly cached, then recipe and time); its description holds the learning "
    "figures and its children are the stages. The saved view `Headline` compares parents on test "
    "accuracy (trained, warm-started, untrained) beside chance; a parent's `reward/*` charts follow "
    "the three GRPO stages on one global step, and the evaluate stage holds `report.md` and the "
    "per-question `predictions_table.json`. Arriving from MLflow's home page, switch the sidebar "
    "from GenAI to Model training to see the runs."
)
# Files of a stage folder worth attaching to its run.
STAGE_ARTIFACTS = ("summary.json", "montage.jpg", "report.md", "metrics.json", "manifest.json",
                   "failures.parquet", "accuracy_by_task.png", "paper_comparison.csv", "reward_curves.png")
# JSON tables of a stage folder, shown by the UI as tables.
STAGE_TABLES = ("predictions_table.json",)
# Which process a run belongs to, so the next run can tell a run whose process is gone
# (kill -9 leaves it RUNNING for good) from one that is still going.
OWNER_TAG = "embodied_r.owner"


def owner_tags() -> dict[str, str]:
    return {OWNER_TAG: process_name()}


@dataclass(frozen=True)
class Tracker:
    """What a stage needs to log into the pipeline's MLflow runs (picklable, small)."""

    uri: str
    experiment_id: str
    parent_run_id: str | None = None

    @property
    def client(self) -> Any:
        """The store's client for reads: each call waits for a server that is away (up to the
        bound) and fails as ``TrackingLost`` once the store is lost."""
        return link(self.uri).reads()

    def guard(self, where: str):
        """A block of bookkeeping that a lost store skips (``link.guard``)."""
        return guard(self.uri, where)

    @classmethod
    def open(cls, experiment: str, uri: str, root: Path | None = None, outage_s: float | None = None) -> "Tracker":
        """The experiment's tracker, store and experiment created when missing, after sending what ended
        processes kept. A SQLite store is first touched under the home's lock (two fresh runs would
        both migrate it, and one fail); a server that does not answer is named in one line at once."""
        check_store(uri)
        with opening(uri):
            if uri.startswith("sqlite:"):
                with home_lock(root, "create the MLflow store"):
                    return cls._open(experiment, uri, root, outage_s)
            return cls._open(experiment, uri, root, outage_s)

    @classmethod
    def _open(cls, experiment: str, uri: str, root: Path | None, outage_s: float | None) -> "Tracker":
        store = link(uri)
        store.opened(outage_s)
        client = store.client()
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            location = None
            if not uri.startswith(("http://", "https://", "databricks")):
                # Keep artifacts beside the store, not in ./mlruns of whatever folder we ran from.
                location = artifacts_root(root).as_uri()
            exp_id = client.create_experiment(experiment, artifact_location=location, tags=EXPERIMENT_KIND)
        else:
            exp_id = exp.experiment_id
        close_orphaned_runs(client, exp_id)
        if exp is None or not exp.tags.get("mlflow.note.content"):
            for key, value in {**EXPERIMENT_KIND, "mlflow.note.content": EXPERIMENT_NOTE}.items():
                client.set_experiment_tag(exp_id, key, value)
        if exp is None or RUN_LIST_VIEW_TAG not in exp.tags:
            # Only when missing: a view the user overwrote in the UI stays theirs.
            client.set_experiment_tag(exp_id, RUN_LIST_VIEW_TAG, run_list_view())
        return cls(uri=uri, experiment_id=exp_id)

    def _send(self, op: str, run_id: str = "", **fields: Any) -> str | None:
        return link(self.uri).send({"op": op, "run": run_id, **fields})

    def start_parent(self, name: str, tags: dict[str, str], params: dict[str, Any]) -> "Tracker":
        run_id = self._send("create", experiment=self.experiment_id, name=name, tags={**owner_tags(), **tags})
        tracker = Tracker(self.uri, self.experiment_id, run_id)
        tracker.log_params(run_id or "", params)
        return tracker

    def start_stage(self, stage: str, params: dict[str, Any], tags: dict[str, str] | None = None) -> str:
        all_tags = {**owner_tags(), "stage": stage, **(tags or {})}
        if self.parent_run_id:
            all_tags["mlflow.parentRunId"] = self.parent_run_id
        run_id = self._send("create", experiment=self.experiment_id, name=stage, tags=all_tags) or ""
        self.log_params(run_id, params)
        return run_id

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        items = [[k, v] for k, v in safe_params(params).items()]
        for i in range(0, len(items), 100):
            self._send("batch", run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        self.log_steps(run_id, [(metrics, step, time.time())])

    def log_steps(self, run_id: str, points: Iterable[tuple[dict[str, float], int, float]]) -> None:
        """Several steps' metrics at once: ``(metrics, step, time.time() of the step)``."""
        self.log_points(run_id, [(k, v, int(when * 1000), step) for metrics, step, when in points
                                 for k, v in metrics.items()])

    def log_points(self, run_id: str, points: list[tuple[str, float, int, int]], batch: int = 500) -> None:
        """Metric points as they are: ``(key, value, timestamp in ms, step)``."""
        for i in range(0, len(points), batch):
            self._send("batch", run_id, metrics=[list(p) for p in points[i : i + batch]])

    def log_artifacts(self, run_id: str, paths: Iterable[Path]) -> None:
        for path in paths:
            if Path(path).is_file():
                self._send("artifact", run_id, path=str(path))

    def log_table(self, run_id: str, path: Path, artifact_file: str | None = None) -> None:
        """Log a JSON table (pandas "split" layout) so the UI shows it as a table. Written
        whole each time: MLflow's own ``log_table`` appends by downloading the old file."""
        self._send("table", run_id, path=str(path), name=artifact_file or Path(path).name)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self._send("end", run_id, status=status, at=int(time.time() * 1000))

    def rename(self, run_id: str, name: str) -> None:
        self._send("rename", run_id, name=name)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        items = [[k, v] for k, v in tags.items()]
        for i in range(0, len(items), 100):
            self._send("batch", run_id, tags=items[i : i + 100])


def record_stage(tracker: Tracker, run_id: str, out: Path, summary: dict[str, Any], as_params: bool = False) -> None:
    metrics, params = stage_record(summary, as_params)
    tracker.log_metrics(run_id, metrics)
    tracker.log_params(run_id, params)
    tracker.log_artifacts(run_id, [Path(out) / name for name in STAGE_ARTIFACTS])
    for name in STAGE_TABLES:
        if (Path(out) / name).is_file():
            tracker.log_table(run_id, Path(out) / name)


def close_orphaned_runs(client: Any, experiment_id: str) -> list[str]:
    """Mark KILLED the RUNNING runs of this host whose process no longer exists; their ids."""
    closed = []
    try:
        runs = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=500)
    except Exception:  # noqa: BLE001 - bookkeeping must never stop a run
        return closed
    for run in runs:
        owner = run.data.tags.get(OWNER_TAG, "")
        if not gone(owner):
            continue
        try:
            client.set_tag(run.info.run_id, "embodied_r.ended", "its process died; marked by a later run")
            client.set_terminated(run.info.run_id, status="KILLED")
            closed.append(run.info.run_id)
        except Exception:  # noqa: BLE001
            pass
    return closed

