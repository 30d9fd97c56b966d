"""What a run is called in MLflow: its params (secrets left out), its metrics' names and chart
groups, the headline columns of the run list, the runs' names and the UI's links to them."""

from __future__ import annotations

import json
import math
import os
import re
import time
from typing import Any

from embodied_r.io import OUTPUTS_KEY

# Keys that could hold a secret are never logged, whatever section they sit in.
_SECRET_WORDS = ("api_key", "token", "secret", "password")
_PARAM_MAX = 6000  # MLflow's limit on a param value
MODEL_NAME = "embodied-r-reasoner"  # the registered model's name unless a recipe names another


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
# MLflow 3's run list keeps its chosen metric columns in the browser; a saved view (experiment tag
# ``mlflow.sharedViewState.<id>``, opened by ``viewStateShareKey=<id>`` on ``#/experiments/<id>/runs``,
# since the experiment's own address drops the parameter) keeps them in the store.
RUN_LIST_VIEW = "headline"
RUN_LIST_VIEW_TAG = f"mlflow.sharedViewState.{RUN_LIST_VIEW}"
RUN_LIST_VIEW_NAME = "Headline (test accuracy %)"
# The figures a parent run carries for the run list (``headline_metrics``): accuracies in
# percent rounded to a tenth, as the report prints them; the UI shows a metric's value unrounded.
# Short names: the UI cuts column headers, and orders metric columns by name.
HEADLINE_GROUP = "test"
HEADLINE_COLUMNS = ("trained", "warmstart", "untrained", "chance", "questions")
CACHE_TAG = "cache_status"
# The tag of a run (parent or training stage) whose figures show failure signatures, one a line:
# searchable in the run list with tags.failure_signatures LIKE '%'.
SIGNATURES_TAG = "failure_signatures"
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
# The completions' mean length in tokens: a reasoner that stops reasoning grows shorter, one
# padding its reasoning to game a reward grows longer.
LENGTH = {"response_length": "completions/mean_length"}

_TIMING_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time",
              "total_flos", "train_loss", "runtime", "samples_per_second", "steps_per_second"}
_EVAL_PREFIXES = ("consistency/", "count/", "parsed/", "response_tokens/")


def trainer_metric_name(key: str) -> str:
    """Where a trainer's per-step log key goes: ``reward/...``, ``timing/...`` or ``train/...`` (TRL's
    flat names would land in one chart group); ``eval_`` keys of TRL's validation go to ``val/``
    (``val/reward/total``), their timings to ``timing/eval_...``."""
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


def stage_record(summary: dict[str, Any], as_params: bool = False) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, params) of a stage's run from its summary; a kind that charts per-step curves
    (``StageKind.summary_as_params``) records its ``summary/`` figures as params, not one-point charts."""
    metrics = stage_metrics(summary)
    if not as_params:
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


HEADLINE = ("accuracy/overall", "accuracy/macro", "accuracy/paper_tasks")
# Opens MLflow 3's "Model training" side: the UI starts on GenAI whatever the experiment's kind
# tag says, and only this parameter overrides it for one page.
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


