"""How a pipeline run reads in MLflow: the parent's name and description, cached children that
link to (and carry a copy of) the run that did the work, and links to the report and Prefect.

Every helper takes the ``Tracker`` of the pipeline and works on any MLflow store.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from embodied_r.pipeline import StagePlan
from embodied_r.tracking import RUN_LIST_VIEW, STAGE_ARTIFACTS, STAGE_TABLES, Tracker, record_stage

HEADLINE = ("accuracy/overall", "accuracy/macro", "accuracy/paper_tasks")


def parent_name(recipe: str, only: list[str] | None = None, when: float | None = None) -> str:
    """``demo 2026-11-23 14:05`` (``fresh``/``cached`` is added when the run ends)."""
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(when or time.time()))
    return f"{recipe} {'+'.join(only) + ' ' if only else ''}{stamp}"


def cache_status(selected: list[str], cached: list[str]) -> str:
    if not cached:
        return "fresh"
    return "cached" if set(cached) >= set(selected) else f"partly cached ({len(cached)}/{len(selected)})"


def ui_base(uri: str) -> str:
    """The MLflow UI's address for a tracking URI: the server itself, or the local
    ``mlflow ui`` the CLI tells the user to start for a SQLite store."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    # MLflow 3.17's UI keeps a GenAI/training switch of its own (it ignores the experiment's
    # kind once that switch exists); the parameter opens the training side.
    return f"{ui_base(uri)}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def runs_url(uri: str, experiment_id: str) -> str:
    """The experiment's run list in the saved view that shows ``accuracy/overall`` as a column."""
    return f"{ui_base(uri)}/{run_list_path(experiment_id)}"


def run_list_path(experiment_id: str) -> str:
    return f"#/experiments/{experiment_id}/runs?workflowType=machine_learning&viewStateShareKey={RUN_LIST_VIEW}"


def prefect_flow_run_url(flow_run_id: str) -> str:
    """The Prefect UI page of a flow run, when a Prefect server is configured."""
    api = os.environ.get("PREFECT_UI_URL") or os.environ.get("PREFECT_API_URL") or ""
    if not api or not flow_run_id:
        return ""
    base = api[: -len("/api")] if api.rstrip("/").endswith("/api") else api
    return f"{base.rstrip('/')}/runs/flow-run/{flow_run_id}"


def source_run(tracker: Tracker, sp: StagePlan) -> Any | None:
    """The first finished run that computed this stage's output (same stage key, not a cache hit)."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        filter_string=f"tags.stage_key = '{sp.key}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time ASC"], max_results=50)
    return next((r for r in runs if r.data.tags.get("cache_hit") != "true"), None)


def copy_history(tracker: Tracker, source_id: str, run_id: str) -> int:
    """Every metric's full history (steps included) from ``source_id`` into ``run_id``."""
    from mlflow.entities import Metric

    client = tracker.client
    points = []
    for key in client.get_run(source_id).data.metrics:
        points += [Metric(m.key, m.value, m.timestamp, m.step) for m in client.get_metric_history(source_id, key)]
    for i in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=points[i : i + 1000])
    return len(points)


def copy_extra_artifacts(tracker: Tracker, source_id: str, run_id: str) -> None:
    """Files the source logged that are not in the stage folder (the completions table)."""
    client = tracker.client
    from_folder = set(STAGE_ARTIFACTS) | set(STAGE_TABLES)
    extra = [a.path for a in client.list_artifacts(source_id) if not a.is_dir and a.path not in from_folder]
    if not extra:
        return
    tables = {t["path"] for t in _logged_tables(client.get_run(source_id).data.tags)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in extra:
            local = Path(client.download_artifacts(source_id, name, tmp))
            if name in tables:
                tracker.log_table(run_id, local, name)
            else:
                client.log_artifact(run_id, str(local))


def _logged_tables(tags: dict[str, str]) -> list[dict[str, str]]:
    import json

    try:
        return [t for t in json.loads(tags.get("mlflow.loggedArtifacts", "[]")) if t.get("type") == "table"]
    except ValueError:
        return []


def log_cached_stage(tracker: Tracker, sp: StagePlan, summary: dict[str, Any]) -> str:
    """A stage served from the cache still gets a complete child run: its params, the metric
    history and artifacts of the run that computed it, and a ``source_run_id`` link to that
    run. Returns the source run's id ("" when no run of this store made it)."""
    source = source_run(tracker, sp)
    source_id = source.info.run_id if source is not None else ""
    run_id = tracker.start_stage(sp.name, sp.params, tags={
        "stage_key": sp.key, "output": sp.out, "cache_hit": "true", "source_run_id": source_id})
    if source is not None:
        copy_history(tracker, source_id, run_id)
        tracker.set_tags(run_id, {"mlflow.note.content": (
            f"Served from the cache: the output was computed by run [{source.info.run_name}]"
            f"(#/experiments/{tracker.experiment_id}/runs/{source_id}); its metrics and files are copied here.")})
    record_stage(tracker, run_id, Path(sp.out), summary)
    if source is not None:
        copy_extra_artifacts(tracker, source_id, run_id)
    tracker.finish(run_id)
    return source_id


def stage_run_ids(tracker: Tracker) -> dict[str, str]:
    """The parent's children by stage name."""
    children = tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{tracker.parent_run_id}'")
    return {c.data.tags.get("stage", c.info.run_name): c.info.run_id for c in children}


def parent_note(*, recipe: str, status: str, final: dict[str, Any], split: str, experiment_id: str,
                children: dict[str, str], registered: str = "", prefect_url: str = "",
                flow_run: str = "") -> str:
    """The parent run's description: headline accuracies, split, cache status and links."""
    lines = [f"**Recipe** `{recipe}` · **{status}**", ""]
    heads = [f"{k.split('/', 1)[1]} **{100 * final[k]:.1f} %**" for k in HEADLINE
             if isinstance(final.get(k), (int, float))]
    if heads:
        lines += [f"Accuracy on the `{split}` split ({int(final.get('count/overall', 0))} questions): "
                  + ", ".join(heads), ""]
    if registered:
        lines += [f"Registry: {registered}", ""]
    lines.append(f"- [All runs with accuracy/overall]({run_list_path(experiment_id)})")
    if "evaluate" in children:
        lines.append(f"- [Evaluation report (report.md)](#/experiments/{experiment_id}/runs/"
                     f"{children['evaluate']}/artifacts/report.md), also attached to this run")
    train = [n for n in children if n.startswith("train_")]
    if train:
        last = sorted(train)[-1]
        lines.append(f"- Training curves: [{last}](#/experiments/{experiment_id}/runs/{children[last]}/"
                     "model-metrics) (one global step across the stages)")
    if prefect_url:
        lines.append(f"- Prefect flow run: [{flow_run or 'open'}]({prefect_url})")
    elif flow_run:
        lines.append(f"- Prefect flow run: `{flow_run}`")
    return "\n".join(lines) + "\n"
