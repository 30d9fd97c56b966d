"""Running stages in this process: each a cached Prefect task with its own MLflow child run."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from prefect import get_run_logger
from prefect.context import get_run_context
from prefect.filesystems import LocalFileSystem

from embodied_r import paths
from embodied_r.config import Recipe
from embodied_r.io import is_complete, read_summary
from embodied_r.pipeline import StagePlan, downstream, plan, resolve_stage_name, select_stages
from embodied_r.tracking import Tracker, numeric_metrics, tracking_uri
from tasks.stages import STAGE_TASKS


def discard(out: Path) -> None:
    """Remove a stage's output so it is recomputed; move aside first so a crash
    mid-delete never leaves a folder that looks complete."""
    for path in (out, out.with_name(out.name + ".partial")):
        if path.exists():
            trash = path.with_name(f".trash-{uuid.uuid4().hex[:8]}-{path.name}")
            path.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)


def refresh_set(stages: dict[str, StagePlan], refresh: list[str]) -> list[str]:
    chosen: set[str] = set()
    for name in refresh:
        chosen.update(downstream(stages, resolve_stage_name(stages, name)))
    return [s for s in stages if s in chosen]


def discard_refreshed(stages: dict[str, StagePlan], refresh: list[str]) -> list[str]:
    """Dependants are discarded too, even when not run now: their folders are keyed by
    the same hashes and would otherwise be taken as up to date on the next run."""
    names = refresh_set(stages, refresh)
    for name in names:
        discard(Path(stages[name].out))
    return names


def result_storage(root: Path) -> LocalFileSystem:
    """Task results live under the project home (Prefect wants the block saved first)."""
    base = paths.prefect_results(root)
    storage = LocalFileSystem(basepath=str(base))
    storage.save("embodied-r-results-" + hashlib.sha256(str(base).encode()).hexdigest()[:10], overwrite=True)
    return storage


def flow_run_id() -> str:
    try:
        return str(get_run_context().flow_run.id)
    except Exception:  # noqa: BLE001 - outside a flow run
        return ""


@contextmanager
def scoped_env(**values: str) -> Iterator[None]:
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


def open_tracker(recipe: Recipe, root: Path, name: str, selected: list[str], refreshed: list[str],
                 parent_run_id: str | None = None) -> Tracker:
    """The pipeline's MLflow parent run: a new one, or the one a dispatching flow made."""
    tracker = Tracker.open(recipe.tracking.experiment, tracking_uri(recipe.tracking.tracking_uri, root), root)
    if parent_run_id:
        return Tracker(tracker.uri, tracker.experiment_id, parent_run_id)
    return tracker.start_parent(
        name=name,
        tags={"prefect.flow_run_id": flow_run_id(), "recipe": recipe.name,
              "stages": ",".join(selected), "refresh": ",".join(refreshed)},
        params={"recipe": recipe.model_dump(mode="json")},
    )


def log_cached_stage(tracker: Tracker, sp: StagePlan, summary: dict[str, Any]) -> None:
    """A stage served from the cache still gets its child run, so every pipeline run is
    complete in the MLflow UI."""
    run_id = tracker.start_stage(sp.name, sp.config, tags={
        "stage_key": sp.key, "output": sp.out, "cache_hit": "true"})
    tracker.log_metrics(run_id, numeric_metrics(summary))
    tracker.finish(run_id)


def promote_trained(recipe: Recipe, root: Path, stages: dict[str, StagePlan], tracker: Tracker) -> str:
    """Register the trained reasoner once and let it take the champion alias if it beats the
    current one on the validation split (``tracking.promote``)."""
    from embodied_r.pipeline import training_stage_names
    from embodied_r.lifecycle.promote import register_and_promote
    from embodied_r.evaluation.registry import version_of_folder

    if not recipe.tracking.promote:
        return ""
    folder = Path(stages[training_stage_names(stages)[-1]].out) / "model"
    known = version_of_folder(recipe.tracking.registered_model, folder, tracker.uri)
    if known is not None:
        return f"{recipe.tracking.registered_model} v{known.version} is this model (registered before)"
    # The model's files are logged under the pipeline run that made it.
    result = register_and_promote(recipe, root, folder, run_id=tracker.parent_run_id,
                                  split=recipe.tracking.promote_split,
                                  metric=recipe.tracking.promote_metric,
                                  tags={"pipeline_run": tracker.parent_run_id or ""})
    get_run_logger().info(result.describe())
    tracker.set_tags(tracker.parent_run_id, {
        "registered_version": result.candidate_version, "promoted": str(result.promoted).lower()})
    return result.describe()


def finish_parent(tracker: Tracker, stages: dict[str, StagePlan], cached: list[str]) -> dict[str, Any]:
    """Copy the evaluation's accuracies onto the parent run and close it."""
    evaluate = stages.get("evaluate")
    final = read_summary(Path(evaluate.out)) if evaluate and is_complete(Path(evaluate.out)) else {}
    tracker.log_metrics(tracker.parent_run_id, {k: v for k, v in numeric_metrics(final).items()
                                                if k.startswith(("accuracy", "learning/"))})
    if evaluate is not None:
        # The reward curves of all training stages belong to the run as a whole.
        tracker.log_artifacts(tracker.parent_run_id, [Path(evaluate.out) / "reward_curves.png"])
    tracker.set_tags(tracker.parent_run_id, {"cached_stages": ",".join(cached)})
    tracker.finish(tracker.parent_run_id)
    return final


def run_in_process(recipe: Recipe, root: Path, refresh: list[str] | None = None,
                   only: list[str] | None = None, parent_run_id: str | None = None) -> dict[str, Any]:
    """Run the selected stages (all by default) here, one Prefect task each."""
    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        logger = get_run_logger()
        stages = plan(recipe, root)
        selected = select_stages(stages, only, recipe.name)
        refreshed = discard_refreshed(stages, refresh or [])
        tracker = open_tracker(recipe, root, f"{recipe.name}-{'-'.join(selected) if only else 'pipeline'}",
                               selected, refreshed, parent_run_id)
        storage = result_storage(root)
        cached: list[str] = []
        promotion = ""
        try:
            for name in selected:
                sp = stages[name]
                task = STAGE_TASKS[sp.kind].with_options(
                    name=name, result_storage=storage, refresh_cache=name in refreshed or not sp.complete)
                state = task(sp.to_dict(), tracker, return_state=True)
                result = state.result()  # raises the stage's own error when it failed
                if state.name == "Cached":
                    cached.append(name)
                    log_cached_stage(tracker, sp, result["summary"])
                logger.info("%s: %s%s", name, sp.out, " (cached)" if state.name == "Cached" else "")
            if "evaluate" in selected:
                promotion = promote_trained(recipe, root, stages, tracker)
        except BaseException:
            if not parent_run_id:
                tracker.finish(tracker.parent_run_id, "FAILED")
            raise
        final = finish_parent(tracker, stages, cached) if not parent_run_id else {}
        return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri, "cached": cached,
                "stages": {n: stages[n].out for n in selected}, "evaluation": final,
                "promotion": promotion}
