"""MLflow bookkeeping: one parent run per pipeline run, one child run per stage.

Uses ``MlflowClient`` with explicit run ids rather than the fluent API's global active
run, so stages in worker threads or subprocesses log to the right run.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from embodied_r.paths import artifacts_root, default_tracking_uri

# Keys that could hold a secret are never logged, whatever section they sit in.
_SECRET_WORDS = ("api_key", "token", "secret", "password")
_PARAM_MAX = 6000  # MLflow's limit on a param value


def tracking_uri(configured: str | None = None, root: Path | None = None) -> str:
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)


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


def numeric_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """Flat numbers of a stage summary (nested dicts flattened with '/'), finite only."""
    out = {}
    for key, value in flatten(summary).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key.replace(".", "/")] = float(value)
    return out


@dataclass(frozen=True)
class Tracker:
    """What a stage needs to log into the pipeline's MLflow runs (picklable, small)."""

    uri: str
    experiment_id: str
    parent_run_id: str | None = None

    @property
    def client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.uri)

    @classmethod
    def open(cls, experiment: str, uri: str, root: Path | None = None) -> "Tracker":
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            location = None
            if not uri.startswith(("http://", "https://", "databricks")):
                # Keep artifacts beside the store, not in ./mlruns of whatever folder we ran from.
                location = artifacts_root(root).as_uri()
            exp_id = client.create_experiment(experiment, artifact_location=location)
        else:
            exp_id = exp.experiment_id
        return cls(uri=uri, experiment_id=exp_id)

    def start_parent(self, name: str, tags: dict[str, str], params: dict[str, Any]) -> "Tracker":
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        tracker = Tracker(self.uri, self.experiment_id, run.info.run_id)
        tracker.log_params(run.info.run_id, params)
        return tracker

    def start_stage(self, stage: str, params: dict[str, Any], tags: dict[str, str] | None = None) -> str:
        all_tags = {"stage": stage, **(tags or {})}
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
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in metrics.items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(run_id, metrics=items[i : i + 500])

    def log_artifacts(self, run_id: str, paths: Iterable[Path]) -> None:
        for path in paths:
            if Path(path).is_file():
                self.client.log_artifact(run_id, str(path))

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)


# Files of a stage folder worth attaching to its run.
STAGE_ARTIFACTS = ("summary.json", "montage.jpg", "report.md", "metrics.json", "manifest.json",
                   "failures.parquet", "accuracy_by_task.png", "paper_comparison.csv", "reward_curves.png")


def record_stage(tracker: Tracker, run_id: str, out: Path, summary: dict[str, Any]) -> None:
    tracker.log_metrics(run_id, numeric_metrics(summary))
    tracker.log_artifacts(run_id, [Path(out) / name for name in STAGE_ARTIFACTS])
