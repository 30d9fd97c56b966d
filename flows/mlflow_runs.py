"""How a pipeline run reads in MLflow: the parent's name and description, cached children that
link to (and carry a copy of) the run that did the work, and links to the report and Prefect.

Every helper takes the ``Tracker`` of the pipeline and works on any MLflow store.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from embodied_r.evaluation.learning import PAIRED, PHASES, SIGNATURES_TAG, training_signatures
from embodied_r.pipeline import StagePlan
from embodied_r.stage_kinds import params
from embodied_r.tracking import (RUN_LIST_VIEW, STAGE_ARTIFACTS, STAGE_TABLES, Tracker, headline_metrics,
                                 numeric_metrics, record_stage)

HEADLINE = ("accuracy/overall", "accuracy/macro", "accuracy/paper_tasks")
# The parameter that opens MLflow 3's "Model training" side rather than its GenAI side (traces).
# The UI keeps the sidebar's GenAI / Model training switch in the browser and starts on GenAI,
# whatever the experiment's kind tag says; only this parameter overrides it for one page.
TRAINING_VIEW = "workflowType=machine_learning"
SIDEBAR_HINT = ("Arriving from MLflow's home page, switch the sidebar from GenAI to \"Model training\" "
                "(the switch at its top) to see the runs; the links here open that view directly.")


def parent_name(recipe: str, only: list[str] | None = None, when: float | None = None) -> str:
    """``demo 2026-11-23 14:05`` while it runs; ``finished_name`` puts what tells it apart first."""
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(when or time.time()))
    return f"{recipe} {'+'.join(only) + ' ' if only else ''}{stamp}"


def finished_name(name: str, status: str) -> str:
    """``fresh demo 2026-11-23 14:05``: the run list cuts long names, so the cache status, the one
    word that tells two runs of a recipe apart, comes first."""
    word = status.split(" (")[0]
    return name if name.startswith(word + " ") else f"{word} {name}"


def cache_status(selected: list[str], cached: list[str]) -> str:
    if not cached:
        return "fresh"
    return "cached" if set(cached) >= set(selected) else f"partly cached ({len(cached)}/{len(selected)})"


def ui_base(uri: str) -> str:
    """The MLflow UI's address for a tracking URI: the server itself, or the local
    ``mlflow ui`` the CLI tells the user to start for a SQLite store."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"


def ui_path(path: str, **query: str) -> str:
    """An address inside the UI (``#/experiments/...``), opening the model-training view."""
    extra = "".join(f"&{k}={v}" for k, v in query.items())
    return f"#/{path.lstrip('#/')}?{TRAINING_VIEW}{extra}"


def run_path(experiment_id: str, run_id: str, tab: str = "") -> str:
    """A run's page (``tab``: ``model-metrics``, ``artifacts/<file>``), as a link in the UI."""
    return ui_path(f"experiments/{experiment_id}/runs/{run_id}" + (f"/{tab}" if tab else ""))


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_base(uri)}/{run_path(experiment_id, run_id)}"


def runs_url(uri: str, experiment_id: str) -> str:
    """The experiment's run list in the saved view that shows the headline figures as columns."""
    return f"{ui_base(uri)}/{run_list_path(experiment_id)}"


def compare_url(uri: str, experiment_id: str, run_ids: list[str]) -> str:
    """MLflow's compare view of ``run_ids``: their params and metrics side by side."""
    from urllib.parse import quote

    runs, experiments = json.dumps(list(run_ids)), json.dumps([experiment_id])
    return f"{ui_base(uri)}/#/compare-runs?runs={quote(runs)}&experiments={quote(experiments)}&{TRAINING_VIEW}"


def run_list_path(experiment_id: str) -> str:
    return ui_path(f"experiments/{experiment_id}/runs", viewStateShareKey=RUN_LIST_VIEW)


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
    run_id = tracker.start_stage(sp.name, params(sp), tags={
        "stage_key": sp.key, "output": sp.out, "cache_hit": "true", "source_run_id": source_id})
    if source is not None:
        copy_history(tracker, source_id, run_id)
        # What the trainer logged of its own arguments (``trainer.``), so the copy reads as the original.
        own = tracker.client.get_run(run_id).data.params
        tracker.log_params(run_id, {k: v for k, v in source.data.params.items() if k not in own})
        tracker.set_tags(run_id, {"mlflow.note.content": (
            f"Served from the cache: the output was computed by run [{source.info.run_name}]"
            f"({run_path(tracker.experiment_id, source_id)}); its metrics, params and files are copied here.")})
    record_stage(tracker, run_id, Path(sp.out), summary, sp.kind)
    if signatures := training_signatures(sp.name, summary):
        tracker.set_tags(run_id, {SIGNATURES_TAG: "\n".join(signatures)})
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
                children: dict[str, str], run_id: str = "", registered: str = "", registered_by: str = "",
                has_curves: bool = False, prefect_url: str = "", flow_run: str = "") -> str:
    """The parent run's description: the headline accuracies and the learning block (each policy
    beside chance, with 95 % intervals, and the verdict), the registered model, and links that
    open the model-training view: the run list, the report, the rewards of all stages."""
    from embodied_r.evaluation.learning import learning_table

    lines = [f"**{status}** run of recipe `{recipe}`", ""]
    heads = [f"{k.split('/', 1)[1]} **{100 * final[k]:.1f} %**" for k in HEADLINE
             if isinstance(final.get(k), (int, float))]
    if heads:
        lines += [f"Accuracy on the `{split}` split ({int(final.get('count/overall', 0))} questions): "
                  + ", ".join(heads), ""]
    learning = learning_table(final)
    if learning:
        lines += [f"**Learning** (`{split}` accuracy of each policy, 95 % interval, beside chance):", ""]
        lines += learning + [""]
    if registered:
        name, _, version = registered.rpartition(" v")
        link = f"[{registered}]({ui_path(f'models/{name}/versions/{version}')})"
        lines += [f"Registered model: {link}" + (
            "" if not registered_by or registered_by == run_id else
            f", logged by [the run that trained it]({run_path(experiment_id, registered_by)}); this run's "
            "model is the same files, so MLflow lists it under that run"), ""]
    lines.append(f"- [All runs, headline columns]({run_list_path(experiment_id)})")
    if "evaluate" in children:
        lines.append(f"- [Evaluation report (report.md)]({run_path(experiment_id, children['evaluate'], 'artifacts/report.md')}),"
                     " also attached to this run")
    if run_id and has_curves:
        lines.append(f"- Rewards of all GRPO stages on one global step: [one chart (reward_curves.png)]"
                     f"({run_path(experiment_id, run_id, 'artifacts/reward_curves.png')}), and this run's "
                     f"[reward charts]({run_path(experiment_id, run_id, 'model-metrics')})")
    if prefect_url:
        lines.append(f"- Prefect flow run: [{flow_run or 'open'}]({prefect_url})")
    elif flow_run:
        lines.append(f"- Prefect flow run: `{flow_run}`")
    lines += ["", SIDEBAR_HINT]
    return "\n".join(lines) + "\n"


def parent_metrics(final: dict[str, Any]) -> dict[str, float]:
    """What the parent run charts of its evaluation: the headline accuracies, each policy's
    accuracy beside chance, the trained policy's paired gain over its start with its p-value
    and the run list's rounded columns, one chart each. Per-task
    accuracies, intervals and reward quarters stay on the evaluate run, in the description and
    in the report, so comparing parents starts on the headline and the parent's chart page
    reaches its reward curves past a dozen single bars, not fifty."""
    figures = {k: v for k, v in numeric_metrics(final).items()
               if k in HEADLINE or k in {f"learning/accuracy/{p}" for p in PHASES}
               or k in {f"{PAIRED}/difference", f"{PAIRED}/p_value"}}
    return {**figures, **headline_metrics(final)}


def log_reward_curves(tracker: Tracker, stages: dict[str, StagePlan], selected: list[str]) -> bool:
    """Every reward of every GRPO stage of this run onto the parent, on the trainers' global step:
    the parent's ``reward/*`` charts follow the three stages on one axis. False when none trained."""
    from mlflow.entities import Metric

    from embodied_r.evaluation.learning import curve_metric, reward_curves

    curves, _ = reward_curves({n: stages[n].out for n in selected if stages[n].kind == "train"})
    now = int(time.time() * 1000)
    points = [Metric(curve_metric(name), value, now, step) for name, series in curves.items() for step, value in series]
    for i in range(0, len(points), 1000):
        tracker.client.log_batch(tracker.parent_run_id, metrics=points[i : i + 1000])
    return bool(points)


def registered_run(tracker: Tracker, registered: str) -> str:
    """The run a registered version (``name vN``) was logged under; "" when unknown."""
    name, _, version = registered.rpartition(" v")
    if not name or not version.isdigit():
        return ""
    try:
        return tracker.client.get_model_version(name, version).run_id or ""
    except Exception:  # noqa: BLE001 - the description then names the version only
        return ""
