"""The one loop over a plan's stages (``run_stages``), for both pipelines, here or on the pools.

Here, each stage is a Prefect task with its own MLflow child run; dispatched, each group of
consecutive stages of one kind is sent to that kind's deployment. Either way the stage folder
is the one record of "done": a complete stage runs nothing and its MLflow child reads cached.
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from prefect import get_run_logger
from prefect.context import get_run_context

from embodied_r import progress
from embodied_r.config import Recipe
from embodied_r.io import DamagedOutput, damaged_outputs, is_complete, partial_path, read_summary
from embodied_r.pipeline import StagePlan, downstream, plan, resolve_stage_name, select_stages
from embodied_r.shards import shard_paths
from embodied_r.stage_kinds import kind_of
from embodied_r.tracking import CACHE_TAG, Tracker, tracking_uri
from embodied_r.tracking_store import TrackingUnavailable, ensure_answers, lost_line, mark_lost, unanswered
from flows import mlflow_runs
from flows.waiting import wait_for_runs
from tasks.stages import STAGE_TASKS


def discard(out: Path) -> None:
    """Remove a stage's output so it is recomputed; move aside first so a crash
    mid-delete never leaves a folder that looks complete."""
    # Its shards' folders too, or a refresh would merge their old work again.
    for path in (out, partial_path(out), *shard_paths(out)):
        if path.is_file():
            path.unlink(missing_ok=True)
        elif path.exists():
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


def relied_on(stages: dict[str, StagePlan], selected: list[str]) -> list[str]:
    """The finished stages a run of ``selected`` takes as done: those it serves from their
    folders, and those read by the stages it runs."""
    names = {n for n in selected if stages[n].complete}
    names.update(d for n in selected if not stages[n].complete for d in stages[n].deps if stages[d].complete)
    return [n for n in stages if n in names]


def discard_damaged(stages: dict[str, StagePlan], selected: list[str]) -> list[str]:
    """A finished folder the run relies on that lost an output since its stage finished
    (``io.damaged_outputs``) is not done: it is discarded with its finished dependants (made
    from what it held) and the run does them again, saying so in one line. Where that would
    redo work on a GPU pool (training, inference), or a stage the run does not include, it
    stops instead, in one line naming ``--refresh``. Returns the stages discarded."""
    discarded: list[str] = []
    while True:
        found = next(((n, p) for n in relied_on(stages, selected) if (p := damaged_outputs(Path(stages[n].out)))),
                     None)
        if found is None:
            return discarded
        name, problems = found
        redo = [n for n in downstream(stages, name) if stages[n].complete]
        costly = [n for n in redo if kind_of(stages[n].kind).pool != "cpu"]
        outside = [n for n in redo if n not in selected]
        lost = "; ".join(problems)
        if costly or outside:
            why = (f"recomputing it redoes {', '.join(costly)}" if costly
                   else f"this run does not include {', '.join(outside)}")
            raise DamagedOutput(f"{name}: its finished folder {stages[name].out} lost outputs ({lost}); {why}: run "
                                f"again with --refresh {name} to recompute it and the stages after it "
                                f"(`embodied-r {stages[name].kind} --refresh` for that stage alone)")
        for n in redo:
            discard(Path(stages[n].out))
        discarded += redo
        after = f", with {', '.join(redo[1:])} made from it," if len(redo) > 1 else ""
        progress.say(progress.stage_line(name, "damaged", note=f"its finished folder lost outputs ({lost}): it{after} "
                                                                "is discarded and done again"))


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
    """The pipeline's MLflow parent run: a new one, or the one a dispatching flow made (whose
    store, found gone, is lost for this run too: the stages run untracked)."""
    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    try:
        tracker = Tracker.open(recipe.tracking.experiment, uri, root)
    except TrackingUnavailable:
        if not parent_run_id:
            raise
        mark_lost(uri, unanswered(uri) or "no answer")
        return Tracker(uri, "", parent_run_id)
    if parent_run_id:
        return Tracker(tracker.uri, tracker.experiment_id, parent_run_id)
    return tracker.start_parent(
        name=mlflow_runs.parent_name(recipe.name, None if name == "pipeline" else name.split("+")),
        tags={"prefect.flow_run_id": flow_run_id(), "recipe": recipe.name,
              "stages": ",".join(selected), "refresh": ",".join(refreshed)},
        params={"recipe": recipe.model_dump(mode="json")},
    )


def log_cached_stage(tracker: Tracker, sp: StagePlan, summary: dict[str, Any]) -> None:
    """A stage served from the cache still gets a complete child run (``mlflow_runs``), and a
    line on the terminal and in Prefect's log."""
    source = ""
    with tracker.guard(sp.name):
        source = mlflow_runs.log_cached_stage(tracker, sp, summary)
    note = f"from run {source[:8]}" if source else "output found on disk"
    progress.say(progress.stage_line(sp.name, "cached", note=note))
    try:
        get_run_logger().info("%s: served from the cache (%s): %s", sp.name, note, sp.out)
    except Exception:  # noqa: BLE001 - outside a flow run
        pass


def promote_trained(recipe: Recipe, root: Path, stages: dict[str, StagePlan], tracker: Tracker) -> str:
    """Register the trained reasoner once and let it take the champion alias if it beats
    chance, the warm-started policy and the current champion on the validation split
    (``tracking.promote``)."""
    from embodied_r.pipeline import training_stage_names
    from embodied_r.lifecycle.promote import register_and_promote
    from embodied_r.evaluation.registry import version_of_folder

    if not recipe.tracking.promote:
        return ""
    folder = Path(stages[training_stage_names(stages)[-1]].out) / "model"
    known = version_of_folder(recipe.tracking.registered_model, folder, tracker.uri)
    if known is not None:
        return f"{recipe.tracking.registered_model} v{known.version} is this model (registered before)"
    # The evaluate stage scored this very folder: its summary is the version's test score.
    evaluate = Path(stages["evaluate"].out)
    final = read_summary(evaluate) if is_complete(evaluate) else {}
    # The model's files are logged under the pipeline run that made it.
    result = register_and_promote(recipe, root, folder, run_id=tracker.parent_run_id,
                                  split=recipe.tracking.promote_split,
                                  metric=recipe.tracking.promote_metric,
                                  tags={"pipeline_run": tracker.parent_run_id or ""},
                                  known={str(final["split"]): final} if final.get("split") else None)
    get_run_logger().info(result.describe())
    tracker.set_tags(tracker.parent_run_id, {
        "registered_version": result.candidate_version, "promoted": str(result.promoted).lower()})
    return result.describe()


def registered_label(promotion: str) -> str:
    """``embodied-r-reasoner v3`` out of a promotion's description, or ""."""
    import re

    found = re.match(r"(\S+ v\d+)", promotion or "")
    return found[1] if found else ""


def evaluation_summary(stages: dict[str, StagePlan]) -> dict[str, Any]:
    """The evaluate stage's summary, {} when it is not done."""
    evaluate = stages.get("evaluate")
    return read_summary(Path(evaluate.out)) if evaluate is not None and evaluate.complete else {}


def finish_parent(tracker: Tracker, stages: dict[str, StagePlan], cached: list[str],
                  selected: list[str] | None = None, recipe: Recipe | None = None,
                  registered: str = "") -> dict[str, Any]:
    """Copy the evaluation's headline and learning figures onto the parent run, with the rewards
    of all training stages, name it by its cache status, write its description and its report,
    and close it."""
    evaluate = stages.get("evaluate")
    final = evaluation_summary(stages)
    parent = tracker.parent_run_id
    selected = selected or list(stages)
    tracker.log_metrics(parent, mlflow_runs.parent_metrics(final))
    has_curves = mlflow_runs.log_reward_curves(tracker, stages, selected)
    if evaluate is not None:
        tracker.log_artifacts(parent, [Path(evaluate.out) / "reward_curves.png"])
    status = mlflow_runs.cache_status(selected, cached)
    run = tracker.client.get_run(parent)
    children = mlflow_runs.stage_run_ids(tracker)
    flow_run = run.data.tags.get("prefect.flow_run_id", "")
    recipe_name = recipe.name if recipe else run.data.tags.get("recipe", "")
    tracker.set_tags(parent, {
        "cached_stages": ",".join(cached), CACHE_TAG: status.split(" (")[0],
        "mlflow.note.content": mlflow_runs.parent_note(
            recipe=recipe_name, status=status, final=final, split=str(final.get("split", "")),
            experiment_id=tracker.experiment_id, children=children, run_id=parent or "",
            registered=registered, registered_by=mlflow_runs.registered_run(tracker, registered),
            has_curves=has_curves, prefect_url=mlflow_runs.prefect_flow_run_url(flow_run), flow_run=flow_run)})
    tracker.client.update_run(parent, name=mlflow_runs.finished_name(run.info.run_name, status))
    if final and evaluate is not None:
        _log_parent_report(tracker, Path(evaluate.out), recipe_name, registered)
    tracker.finish(parent)
    return final


def _log_parent_report(tracker: Tracker, folder: Path, recipe: str, registered: str) -> None:
    """The evaluation report again, on the parent, headed by this run, recipe and model version."""
    import tempfile

    from embodied_r.evaluation.report import render_folder

    run = tracker.client.get_run(tracker.parent_run_id)
    header = {"run": f"{run.info.run_name} ({run.info.run_id})", "recipe": recipe,
              "model version": registered or "not registered"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.md"
        path.write_text(render_folder(folder, header), encoding="utf-8")
        tracker.client.log_artifact(tracker.parent_run_id, str(path))
        if (folder / "accuracy_by_task.png").is_file():
            tracker.client.log_artifact(tracker.parent_run_id, str(folder / "accuracy_by_task.png"))


class StageRunFailed(RuntimeError):
    """A stage's flow run, sent to a work pool, did not complete."""


# Sends one kind's stages elsewhere and waits for them: ``(kind, names, parent MLflow run id)``.
Dispatch = Callable[[str, list[str], str], None]


def stage_groups(stages: dict[str, StagePlan], selected: list[str]) -> list[list[str]]:
    """The selected stages in run order, consecutive stages of one kind together: what one
    dispatched flow run does (the three GRPO stages, evaluate with its baselines)."""
    groups: list[list[str]] = []
    for name in selected:
        if groups and stages[groups[-1][-1]].kind == stages[name].kind:
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def run_stages(stages: dict[str, StagePlan], selected: list[str], tracker: Tracker, *,
               dispatch: Dispatch | None = None,
               after: Callable[[StagePlan, dict[str, Any]], None] | None = None) -> list[str]:
    """Run the selected stages in order and return those served from their folders.

    Without ``dispatch`` each stage is its kind's Prefect task in this process; ``after`` sees
    each stage's summary as it finishes. With ``dispatch`` each group of ``stage_groups`` is
    sent away, unless all its folders are complete: finished work needs no worker (and no GPU).
    """
    cached: list[str] = []
    for group in stage_groups(stages, selected):
        if dispatch is not None:
            if not all(stages[n].complete for n in group):
                dispatch(stages[group[0]].kind, group, tracker.parent_run_id or "")
                continue
            for name in group:
                log_cached_stage(tracker, stages[name], read_summary(Path(stages[name].out)))
            cached += group
            continue
        for name in group:
            sp = stages[name]
            state = STAGE_TASKS[sp.kind].with_options(name=name)(sp.to_dict(), tracker, return_state=True)
            result = state.result()  # raises the stage's own error when it failed
            if state.name == "Cached":
                cached.append(name)
                log_cached_stage(tracker, sp, result["summary"])
            if after is not None:
                after(sp, result["summary"])
    return cached


def run_deployment_of(kind: str, parameters: dict[str, Any]) -> str:
    """Run a stage kind's deployment (on its pool) and wait; a child flow run that fails does
    not raise by itself, so its final state is checked and its own message raised here.
    Returns the child flow run's name."""
    from prefect.deployments import run_deployment

    sent = run_deployment(kind_of(kind).deployment, parameters=parameters, timeout=0)
    child = wait_for_runs({kind: sent})[kind]
    state = child.state
    if state is None or not state.is_completed():
        raise StageRunFailed(
            f"stage {kind!r} (flow run {child.name}, id {child.id}) ended "
            f"{state.type.value if state else 'without a state'}: {state.message if state else ''}"
        )
    try:
        get_run_logger().info("%s: done on pool %s (flow run %s)", kind, kind_of(kind).pool, child.name)
    except Exception:  # noqa: BLE001 - outside a flow run
        pass
    return str(child.name)


def run_in_process(recipe: Recipe, root: Path, refresh: list[str] | None = None,
                   only: list[str] | None = None, parent_run_id: str | None = None) -> dict[str, Any]:
    """Run the selected stages (all by default) here, one Prefect task each."""
    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        stages = plan(recipe, root)
        selected = select_stages(stages, only, recipe.name)
        refreshed = discard_refreshed(stages, refresh or [])
        discard_damaged(stages, selected)
        tracker = open_tracker(recipe, root, "+".join(selected) if only else "pipeline",
                               selected, refreshed, parent_run_id)
        promotion = ""

        def after(sp: StagePlan, summary: dict[str, Any]) -> None:
            if sp.kind == "preprocess" and "evaluate" in selected:
                from embodied_r.lifecycle.promote import check_promotion_split

                check_promotion_split(recipe, summary)  # before hours of work, not after

        try:
            cached = run_stages(stages, selected, tracker, after=after)
            if "evaluate" in selected:
                with tracker.guard("registration"):
                    ensure_answers(tracker.uri)  # the registry's own client is not guarded
                    promotion = promote_trained(recipe, root, stages, tracker)
        except BaseException:
            if not parent_run_id:
                with tracker.guard("the end of the run"):
                    tracker.finish(tracker.parent_run_id, "FAILED")
            raise
        final = {}
        if not parent_run_id:
            final = evaluation_summary(stages)
            with tracker.guard("the end of the run"):
                finish_parent(tracker, stages, cached, selected, recipe, registered_label(promotion))
        return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri, "cached": cached,
                "tracking_lost": lost_line(uri),
                "experiment_id": tracker.experiment_id,
                "mlflow_run_url": mlflow_runs.run_url(uri, tracker.experiment_id, tracker.parent_run_id or ""),
                "mlflow_runs_url": mlflow_runs.runs_url(uri, tracker.experiment_id),
                "stages": {n: stages[n].out for n in selected}, "evaluation": final,
                "promotion": promotion}
