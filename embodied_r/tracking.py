"""MLflow bookkeeping: one parent run per pipeline run, one child run per stage.

Uses ``MlflowClient`` with explicit run ids rather than the fluent API's global active
run, so stages in worker threads or subprocesses log to the right run.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict

from embodied_r.io import OUTPUTS_KEY
from embodied_r.paths import artifacts_root, default_tracking_uri, home_lock
from embodied_r.store_open import ENVIRONMENT, HOME, RECIPE, note_origin
from embodied_r.tracking_store import check_store, guard, guarded, opening

MODEL_NAME = "embodied-r-reasoner"  # the registered model's name unless a recipe names another


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    experiment: str = "embodied-r"
    # None: $MLFLOW_TRACKING_URI, else a SQLite store under the project home.
    tracking_uri: str | None = None
    registered_model: str = MODEL_NAME
    # After evaluation, register the trained reasoner (once per model) and give it the
    # champion alias when it beats chance, the warm-started policy (recipes with a warm
    # start) and the current champion on ``promote_split``.
    promote: bool = False
    promote_split: Literal["train", "val", "test"] = "val"
    promote_metric: str = "accuracy/overall"

# Keys that could hold a secret are never logged, whatever section they sit in.
_SECRET_WORDS = ("api_key", "token", "secret", "password")
_PARAM_MAX = 6000  # MLflow's limit on a param value


def tracking_uri(configured: str | None = None, root: Path | None = None) -> str:
    """The recipe's store, else MLFLOW_TRACKING_URI's, else the home's; noted whence (``store_open``)."""
    if configured:
        return note_origin(configured, RECIPE)
    if env := os.environ.get("MLFLOW_TRACKING_URI"):
        return note_origin(env, HOME if env == default_tracking_uri(root) else ENVIRONMENT)
    return note_origin(default_tracking_uri(root), HOME)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        for i, value in enumerate(data):
            out.update(flatten(value, f"{prefix}{i}."))
    else:
        out[prefix.rstrip(".")] = data
    return out


def safe_params(config: dict[str, Any]) -> dict[str, str]:
    params = {}
    for key, value in flatten(config).items():
        leaf = key.rsplit(".", 1)[-1].lower()
        if any(w in leaf for w in _SECRET_WORDS) and not leaf.endswith("_env"):
            continue
        params[key] = str(value)[:_PARAM_MAX]
    return params


# The MLflow UI groups charts by the name's first segment, one group per concern, and lists the
# groups alphabetically: timings go under a name after ``reward`` so a training run opens on its
# rewards (eval, the one group before it, is never logged by a training run).
METRIC_GROUPS = ("train", "reward", "val", "eval", "timing", "summary")
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
# MLflow 3's run list shows no metric column until one is picked, and keeps that pick in the
# browser's local storage. A saved view keeps it in the store: an experiment tag
# ``mlflow.sharedViewState.<id>`` holding the view (its state a JSON string of the page's
# ``selectedColumns``...), opened by the URL parameter ``viewStateShareKey=<id>`` on the run
# list's own address (``#/experiments/<id>/runs``: the experiment's address redirects there and
# drops the parameter).
RUN_LIST_VIEW = "headline"
RUN_LIST_VIEW_TAG = f"mlflow.sharedViewState.{RUN_LIST_VIEW}"
RUN_LIST_VIEW_NAME = "Headline (test accuracy %)"
# The figures a parent run carries for the run list (``headline_metrics``): accuracies in
# percent rounded to a tenth, as the report prints them; the UI shows a metric's value unrounded.
# Short names: the UI cuts column headers, and orders metric columns by name.
HEADLINE_GROUP = "test"
HEADLINE_COLUMNS = ("trained", "warmstart", "untrained", "chance", "questions")
CACHE_TAG = "cache_status"
# Instead of the UI's default Source, Models and Dataset columns, empty for pipeline runs and
# wide enough to push a metric column off the screen.
RUN_LIST_COLUMNS = tuple(f"metrics.`{HEADLINE_GROUP}/{c}`" for c in HEADLINE_COLUMNS) + (f"tags.`{CACHE_TAG}`",)
# Where a learning figure goes among the headline columns.
_HEADLINE_SOURCES = {name: f"learning/accuracy/{name}" for name in HEADLINE_COLUMNS[:4]}


def run_list_view(now_ms: int | None = None) -> str:
    """The saved view's tag value: the run list with the headline figures as columns."""
    stamp = int(time.time() * 1000) if now_ms is None else now_ms
    state = {"selectedColumns": list(RUN_LIST_COLUMNS)}
    return json.dumps({"name": RUN_LIST_VIEW_NAME, "createdAt": stamp, "updatedAt": stamp,
                       "state": json.dumps(state)})


def headline_metrics(final: dict[str, Any]) -> dict[str, float]:
    """A parent run's run-list figures out of its evaluation summary: each policy's accuracy
    and chance in percent (one decimal), and the number of questions. Only on the test split,
    which the column names promise; the trained accuracy stands in when no baseline was run."""
    if final.get("split") != HEADLINE_GROUP:
        return {}
    out: dict[str, float] = {}
    for column, key in _HEADLINE_SOURCES.items():
        value = final.get(key, final.get("accuracy/overall") if column == "trained" else None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[f"{HEADLINE_GROUP}/{column}"] = round(100 * float(value), 1)
    if isinstance(final.get("count/overall"), (int, float)):
        out[f"{HEADLINE_GROUP}/questions"] = float(int(final["count/overall"]))
    return out


# How much a stage still explores, as TRL logs it per step: the share of groups whose
# completions all scored alike (their advantages are zero: GRPO learns nothing from them)
# and the mean token entropy of the completions. Kept beside the rewards, by these names.
EXPLORATION = {"zero_std_groups": "frac_reward_zero_std", "entropy": "entropy"}
# The completions' mean length in tokens, as TRL logs it per step, by the name the learning
# figures give it. The paper follows response length over training: a reasoner that stops
# reasoning grows shorter, one padding its reasoning to game a reward grows longer.
LENGTH = {"response_length": "completions/mean_length"}

_TIMING_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time",
              "total_flos", "train_loss", "runtime", "samples_per_second", "steps_per_second"}
_EVAL_PREFIXES = ("consistency/", "count/", "parsed/", "response_tokens/")


def trainer_metric_name(key: str) -> str:
    """Where one of the trainer's per-step log keys goes: ``reward/...``, ``timing/...`` or
    ``train/...`` (TRL's flat names otherwise land in one catch-all chart group). TRL's
    validation pass logs the same names behind ``eval_``: they go to ``val/`` under the same
    names (``val/reward/total``, ``val/loss``), its timings to ``timing/eval_...``."""
    if key.startswith("eval_"):
        inner = trainer_metric_name(key[len("eval_"):])
        group, rest = inner.split("/", 1)
        if group == "timing":
            return f"timing/eval_{rest}"
        return f"val/{rest}" if group == "train" else f"val/{inner}"
    if key == "reward":
        return "reward/total"
    if key == "reward_std":
        return "reward/total_std"
    match = re.fullmatch(r"rewards/(.+?)(?:_reward)?/(mean|std)", key)
    if match:
        return f"reward/{match[1]}" + ("_std" if match[2] == "std" else "")
    if key.startswith("profiling/"):
        return "timing/" + re.sub(r"[^\w./ -]+", "", key[len("profiling/"):]).replace("Time taken ", "seconds ")
    if key in _TIMING_KEYS:
        return f"timing/{key}"
    return f"train/{key}"


def stage_metric_name(key: str) -> str:
    """Where one figure of a stage summary goes: headline accuracies keep ``accuracy/...``
    (the run list's column), other evaluation figures ``eval/...``, timings ``timing/...``,
    the rest ``summary/...``."""
    if key.startswith("accuracy/") or key.split("/", 1)[0] in METRIC_GROUPS:
        return key
    if key.startswith(_EVAL_PREFIXES):
        return f"eval/{key}"
    if "seconds" in key:
        return f"timing/{key}"
    return f"summary/{key}"


def stage_metrics(summary: dict[str, Any]) -> dict[str, float]:
    return {stage_metric_name(k): v for k, v in numeric_metrics(summary).items()}


# Stage kinds whose runs chart per-step curves: their summary's single figures would add one
# single-point chart each beside the curves, so they are params (``summary.<name>``) instead.
SUMMARY_AS_PARAMS = frozenset({"train", "warmstart"})


def stage_record(summary: dict[str, Any], kind: str = "") -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, params) a stage's run records from its summary: ``stage_metrics``, with the
    ``summary/`` figures of a training stage as ``summary.`` params, rounded for reading."""
    metrics = stage_metrics(summary)
    if kind not in SUMMARY_AS_PARAMS:
        return metrics, {}
    params = {}
    for name in [n for n in metrics if n.startswith("summary/")]:
        value = metrics.pop(name)
        params["summary." + name[len("summary/"):].replace("/", ".")] = (
            str(int(value)) if value.is_integer() else f"{value:.4g}")
    return metrics, params


def numeric_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """Flat numbers of a stage summary (nested dicts flattened with '/'), finite only; the
    record of its output files (``io.OUTPUTS_KEY``) is no figure."""
    out = {}
    for key, value in flatten({k: v for k, v in summary.items() if k != OUTPUTS_KEY}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key.replace(".", "/")] = float(value)
    return out


# MLflow announces at INFO each new SQLite store's table creation and migration: the first
# lines a user sees of a run, about bookkeeping they did not ask for. Warnings still show.
_STORE_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")


def quiet_store_logs() -> None:
    import logging

    for name in _STORE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # It logs, with the SQL and a traceback, each database error it then raises: the error
    # itself reaches the caller (a full disk becomes the run's one line, ``tracking_store``).
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


@dataclass(frozen=True)
class Tracker:
    """What a stage needs to log into the pipeline's MLflow runs (picklable, small)."""

    uri: str
    experiment_id: str
    parent_run_id: str | None = None

    @property
    def client(self):
        """The store's client; a server's fails at once, as ``TrackingLost``, once it stopped
        answering (``tracking_store``)."""
        from mlflow import MlflowClient

        quiet_store_logs()
        return guarded(MlflowClient(tracking_uri=self.uri), self.uri)

    def guard(self, where: str):
        """A block of bookkeeping that a lost store skips (``tracking_store.guard``)."""
        return guard(self.uri, where)

    @classmethod
    def open(cls, experiment: str, uri: str, root: Path | None = None) -> "Tracker":
        """The experiment's tracker, the store and the experiment created when missing. A
        SQLite store is first touched under the home's lock: two runs starting together on
        a fresh home would otherwise both create and migrate it, and one of them fail. A
        server that does not answer is named in one line (``check_store``), not after minutes
        of the client's retries."""
        check_store(uri)
        with opening(uri):
            if uri.startswith("sqlite:"):
                with home_lock(root, "create the MLflow store"):
                    return cls._open(experiment, uri, root)
            return cls._open(experiment, uri, root)

    @classmethod
    def _open(cls, experiment: str, uri: str, root: Path | None = None) -> "Tracker":
        from mlflow import MlflowClient

        quiet_store_logs()
        client = MlflowClient(tracking_uri=uri)
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

    def start_parent(self, name: str, tags: dict[str, str], params: dict[str, Any]) -> "Tracker":
        run = self.client.create_run(self.experiment_id, run_name=name, tags={**owner_tags(), **tags})
        tracker = Tracker(self.uri, self.experiment_id, run.info.run_id)
        tracker.log_params(run.info.run_id, params)
        return tracker

    def start_stage(self, stage: str, params: dict[str, Any], tags: dict[str, str] | None = None) -> str:
        all_tags = {**owner_tags(), "stage": stage, **(tags or {})}
        if self.parent_run_id:
            all_tags["mlflow.parentRunId"] = self.parent_run_id
        run = self.client.create_run(self.experiment_id, run_name=stage, tags=all_tags)
        self.log_params(run.info.run_id, params)
        return run.info.run_id

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in safe_params(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        self.log_steps(run_id, [(metrics, step, time.time())])

    def log_steps(self, run_id: str, points: Iterable[tuple[dict[str, float], int, float]]) -> None:
        """Several steps' metrics at once: ``(metrics, step, time.time() of the step)``."""
        from mlflow.entities import Metric

        items = [Metric(k, v, int(when * 1000), step) for metrics, step, when in points for k, v in metrics.items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i : i + 500])

    def log_artifacts(self, run_id: str, paths: Iterable[Path]) -> None:
        for path in paths:
            if Path(path).is_file():
                self.client.log_artifact(run_id, str(path))

    def log_table(self, run_id: str, path: Path, artifact_file: str | None = None) -> None:
        """Log a JSON table (pandas "split" layout) so the UI shows it as a table. Written
        whole each time: MLflow's own ``log_table`` appends by downloading the old file."""
        name = artifact_file or Path(path).name
        self.client.log_artifact(run_id, str(path))
        tags = self.client.get_run(run_id).data.tags
        logged = json.loads(tags.get("mlflow.loggedArtifacts", "[]"))
        if {"path": name, "type": "table"} not in logged:
            logged.append({"path": name, "type": "table"})
            self.client.set_tag(run_id, "mlflow.loggedArtifacts", json.dumps(logged))

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)


# Files of a stage folder worth attaching to its run.
STAGE_ARTIFACTS = ("summary.json", "montage.jpg", "report.md", "metrics.json", "manifest.json",
                   "failures.parquet", "accuracy_by_task.png", "paper_comparison.csv", "reward_curves.png")
# JSON tables of a stage folder, shown by the UI as tables.
STAGE_TABLES = ("predictions_table.json",)


def record_stage(tracker: Tracker, run_id: str, out: Path, summary: dict[str, Any], kind: str = "") -> None:
    metrics, params = stage_record(summary, kind)
    tracker.log_metrics(run_id, metrics)
    tracker.log_params(run_id, params)
    tracker.log_artifacts(run_id, [Path(out) / name for name in STAGE_ARTIFACTS])
    for name in STAGE_TABLES:
        if (Path(out) / name).is_file():
            tracker.log_table(run_id, Path(out) / name)


# Which process a run belongs to, so the next run can tell a run whose process is gone
# (kill -9 leaves it RUNNING for good) from one that is still going.
OWNER_TAG = "embodied_r.owner"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux); None when it is gone.
    With the pid, it names a process even after its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_tags() -> dict[str, str]:
    import socket

    return {OWNER_TAG: f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid()) or ''}"}


def close_orphaned_runs(client: Any, experiment_id: str) -> list[str]:
    """Mark KILLED the RUNNING runs of this host whose process no longer exists; their ids."""
    import socket

    host = socket.gethostname()
    closed = []
    try:
        runs = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=500)
    except Exception:  # noqa: BLE001 - bookkeeping must never stop a run
        return closed
    for run in runs:
        owner = run.data.tags.get(OWNER_TAG, "")
        parts = owner.split(":")
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        alive = _start_time(int(parts[1]))
        if alive is not None and (not parts[2] or alive == parts[2]):
            continue
        try:
            client.set_tag(run.info.run_id, "embodied_r.ended", "its process died; marked by a later run")
            client.set_terminated(run.info.run_id, status="KILLED")
            closed.append(run.info.run_id)
        except Exception:  # noqa: BLE001
            pass
    return closed
