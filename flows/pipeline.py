"""The ``embodied-r`` flow: every stage in order, each a cached task with its own MLflow run."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator

from prefect import flow, get_run_logger
from prefect.context import get_run_context
from prefect.filesystems import LocalFileSystem

from embodied_r import paths
from embodied_r.config import Recipe, load_recipe
from embodied_r.pipeline import (
    StagePlan,
    downstream,
    plan,
    resolve_stage_name,
    select_stages,
    training_stage_names,
)
from embodied_r.tracking import Tracker, numeric_metrics, tracking_uri
from tasks.stages import STAGE_TASKS


def _discard(out: Path) -> None:
    """Remove a stage's output so it is recomputed; move aside first so a crash
    mid-delete never leaves a folder that looks complete."""
    for path in (out, out.with_name(out.name + ".partial")):
        if path.exists():
            trash = path.with_name(f".trash-{uuid.uuid4().hex[:8]}-{path.name}")
            path.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)


def _refresh_set(stages: dict[str, StagePlan], refresh: list[str]) -> list[str]:
    chosen: list[str] = []
    for name in refresh:
        for s in downstream(stages, resolve_stage_name(stages, name)):
            if s not in chosen:
                chosen.append(s)
    return [s for s in stages if s in chosen]


def _result_storage(root: Path) -> LocalFileSystem:
    """Task results live under the project home (Prefect wants the block saved first)."""
    base = paths.prefect_results(root)
    storage = LocalFileSystem(basepath=str(base))
    storage.save("embodied-r-results-" + hashlib.sha256(str(base).encode()).hexdigest()[:10], overwrite=True)
    return storage


def _flow_run_id() -> str:
    try:
        return str(get_run_context().flow_run.id)
    except Exception:  # noqa: BLE001 - outside a flow run
        return ""


@contextmanager
def _scoped_env(**values: str) -> Iterator[None]:
    """Stages that run subprocesses (training) find the home and the MLflow store through
    the environment; restore it afterwards so one process can run several pipelines."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_pipeline(recipe: Recipe, root: Path, refresh: list[str] | None = None,
                 only: list[str] | None = None) -> dict[str, Any]:
    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    with _scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        return _run_pipeline(recipe, root, uri, refresh, only)


def _run_pipeline(recipe: Recipe, root: Path, uri: str, refresh: list[str] | None,
                  only: list[str] | None) -> dict[str, Any]:
    logger = get_run_logger()
    stages = plan(recipe, root)
    selected = select_stages(stages, only, recipe.name)
    refreshed = _refresh_set(stages, refresh or [])
    # Dependants are discarded too, even when not run now: their folders are keyed by
    # the same hashes and would otherwise be taken as up to date on the next run.
    for name in refreshed:
        _discard(Path(stages[name].out))

    tracker = Tracker.open(recipe.tracking.experiment, uri, root).start_parent(
        name=f"{recipe.name}-{'-'.join(selected) if only else 'pipeline'}",
        tags={"prefect.flow_run_id": _flow_run_id(), "recipe": recipe.name,
              "stages": ",".join(selected), "refresh": ",".join(refreshed)},
        params={"recipe": recipe.model_dump(mode="json")},
    )
    storage = _result_storage(root)
    results: dict[str, Any] = {}
    cached: list[str] = []
    try:
        for name in selected:
            sp = stages[name]
            task = STAGE_TASKS[sp.kind].with_options(
                name=name, result_storage=storage,
                refresh_cache=name in refreshed or not sp.complete,
            )
            state = task(sp.to_dict(), tracker, return_state=True)
            result = state.result()  # raises the stage's own error when it failed
            if state.name == "Cached":
                cached.append(name)
                run_id = tracker.start_stage(name, sp.config, tags={
                    "stage_key": sp.key, "output": sp.out, "cache_hit": "true"})
                tracker.log_metrics(run_id, numeric_metrics(result["summary"]))
                tracker.finish(run_id)
            results[name] = result
            logger.info("%s: %s%s", name, sp.out, " (cached)" if state.name == "Cached" else "")
    except BaseException:
        tracker.finish(tracker.parent_run_id, "FAILED")
        raise
    final = results.get("evaluate", {}).get("summary", {})
    tracker.log_metrics(tracker.parent_run_id, {k: v for k, v in numeric_metrics(final).items()
                                                if k.startswith("accuracy")})
    tracker.set_tags(tracker.parent_run_id, {"cached_stages": ",".join(cached)})
    tracker.finish(tracker.parent_run_id)
    return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri, "cached": cached,
            "stages": {k: v["out"] for k, v in results.items()},
            "evaluation": final}


@flow(name="embodied-r", log_prints=True)
def embodied_r(recipe: str = "demo", refresh: list[str] | None = None,
               overrides: dict[str, Any] | None = None, home: str | None = None) -> dict[str, Any]:
    """The full pipeline: download -> preprocess -> keyframes -> perception -> convert ->
    training stages -> evaluate. ``refresh`` names stages to recompute with all that follows."""
    root = Path(home).expanduser().resolve() if home else paths.home()
    return run_pipeline(load_recipe(recipe, overrides), root, refresh=refresh)


@flow(name="embodied-r-stage", log_prints=True)
def embodied_r_stage(stage: str, recipe: str = "demo", refresh: bool = False,
                     overrides: dict[str, Any] | None = None, home: str | None = None) -> dict[str, Any]:
    """One stage alone (its inputs must exist); ``refresh`` recomputes it."""
    root = Path(home).expanduser().resolve() if home else paths.home()
    rec = load_recipe(recipe, overrides)
    names = training_stage_names(plan(rec, root)) if stage == "train" else [stage]
    return run_pipeline(rec, root, refresh=[names[0]] if refresh else None, only=names)
