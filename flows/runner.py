"""The one run loop of both pipelines (``run_plan``, over ``run_stages``), here or on the pools.

A run's plan is built once, where the run starts (``plan_of``), and handed to everything after
it. Here, each stage is a Prefect task with its own MLflow child run; dispatched, each group of
consecutive stages of one kind is sent to that kind's deployment with the plan. Either way the
stage folder is the one record of "done": a complete stage runs nothing, is sent nowhere, and
its MLflow child reads cached.
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
from embodied_r.io import damaged_outputs, partial_path, read_summary
from embodied_r.errors import DamagedOutput, StageRunFailed, TrackingUnavailable
from embodied_r.evaluation.learning import SIGNATURES_TAG, failure_signatures, training_signatures
from embodied_r.shards import shard_paths
from embodied_r.stage_kinds import kind_of
from embodied_r.stage_plan import Plan, StagePlan, downstream
from embodied_r.tracking import CACHE_TAG, Tracker, numeric_metrics, tracking_uri
from embodied_r.tracking_store import ensure_answers, lost_line, mark_lost, unanswered
from flows import mlflow_runs
from flows.waiting import wait_for_runs
from tasks.stages import STAGE_TASKS, say_signatures


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


def discard_refreshed(stages: Plan, refresh: list[str]) -> list[str]:
    """Dependants are discarded too, even when not run now: their folders are keyed by
    the same hashes and would otherwise be taken as up to date on the next run."""
    names = stages.downstream(refresh) if refresh else []
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
        redo = [n for n in downstream(stages, [name]) if stages[n].complete]
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


def recipe_of(stages: Plan) -> Any:
    """The validated recipe a plan was made from."""
    if stages.pipeline == "embodied-reasoner":
        from embodied_r.interactive.config import ReasonerRecipe

        return ReasonerRecipe.model_validate(stages.recipe)
    from embodied_r.config import Recipe

    return Recipe.model_validate(stages.recipe)


def plan_of(pipeline: str, recipe: str, overrides: dict[str, Any] | None, home: str | Path | None) -> Plan:
    """Where a run starts without a plan (a deployment run, a stage rerun by hand): the
    recipe read by name and planned, once."""
    from embodied_r import paths

    root = paths.claim_home(Path(home).expanduser().resolve() if home else paths.home())
    from embodied_r.config import load_reasoner, load_recipe
    from embodied_r.pipeline import plan

    return plan((load_reasoner if pipeline == "embodied-reasoner" else load_recipe)(recipe, overrides), root)


def given_plan(plan: dict[str, Any] | None, pipeline: str, recipe: str, overrides: dict[str, Any] | None,
               home: str | Path | None) -> Plan:
    """The plan a flow run was handed, or one made where this run starts."""
    return Plan.from_json(plan) if plan else plan_of(pipeline, recipe, overrides, home)


def open_tracker(recipe: Any, root: Path, name: str, selected: list[str], refreshed: list[str],
                 parent_run_id: str | None = None, stages: Plan | None = None) -> Tracker:
    """The run's MLflow parent run: a new one, holding the plan as ``plan.json``, or the one a
    dispatching flow made (whose store, found gone, is lost for this run too: the stages run
    untracked)."""
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
    tracker = tracker.start_parent(
        name=mlflow_runs.parent_name(recipe.name, None if name == "pipeline" else name.split("+")),
        tags={"prefect.flow_run_id": flow_run_id(), "recipe": recipe.name,
              "stages": ",".join(selected), "refresh": ",".join(refreshed),
              **({"pipeline": stages.pipeline} if stages is not None else {})},
        params={"recipe": recipe.model_dump(mode="json")},
    )
    if stages is not None:
        import tempfile

        with tracker.guard("the plan"), tempfile.TemporaryDirectory() as tmp:
            tracker.log_artifacts(tracker.parent_run_id, [stages.save(Path(tmp))])
    return tracker


def log_cached_stage(tracker: Tracker, sp: StagePlan, summary: dict[str, Any], dispatching: bool = False) -> None:
    """A stage served from the cache still gets a complete child run (``mlflow_runs``), and a
    line on the terminal and in Prefect's log; a dispatching run says it sent it nowhere."""
    source = ""
    with tracker.guard(sp.name):
        source = mlflow_runs.log_cached_stage(tracker, sp, summary)
    note = f"from run {source[:8]}" if source else "output found on disk"
    if dispatching:
        note += f"; not sent to pool {kind_of(sp.kind).pool}"
    progress.say(progress.stage_line(sp.name, "cached", note=note))
    try:
        get_run_logger().info("%s: served from the cache (%s): %s", sp.name, note, sp.out)
    except Exception:  # noqa: BLE001 - outside a flow run
        pass
    say_signatures(training_signatures(sp.name, summary))


def registered_label(stages: dict[str, StagePlan]) -> str:
    """``embodied-r-reasoner v3``: the version the run's promote stage registered, or ""."""
    promote = stages.get("promote")
    if promote is None or not promote.complete:
        return ""
    return f"{promote.config['registered_model']} v{read_summary(Path(promote.out))['registered_version']}"


def promotion_line(stages: dict[str, StagePlan], cached: list[str]) -> str:
    """What the run's promote stage did, for the console; a promotion served from the cache
    registered its model before."""
    promote = stages.get("promote")
    if promote is None or not promote.complete:
        return ""
    if "promote" in cached:
        return f"{registered_label(stages)} is this model (registered before)"
    return str(read_summary(Path(promote.out)).get("description", ""))


def final_stage(stages: dict[str, StagePlan]) -> StagePlan | None:
    """The stage whose summary is the run's result: the last evaluation."""
    return next((stages[n] for n in reversed(list(stages)) if stages[n].kind in ("evaluate", "reasoner_evaluate")),
                None)


def evaluation_summary(stages: dict[str, StagePlan]) -> dict[str, Any]:
    """The final evaluation's summary, {} when it is not done."""
    final = final_stage(stages)
    return read_summary(Path(final.out)) if final is not None and final.complete else {}


def finish_parent(tracker: Tracker, stages: dict[str, StagePlan], cached: list[str],
                  selected: list[str] | None = None, recipe: Any = None,
                  registered: str = "") -> dict[str, Any]:
    """Copy the evaluation's headline and learning figures onto the parent run, with the rewards
    of all training stages, name it by its cache status, write its description and its report,
    and close it."""
    evaluate = final_stage(stages)
    final = evaluation_summary(stages)
    parent = tracker.parent_run_id
    selected = selected or list(stages)
    if evaluate is not None and evaluate.kind == "reasoner_evaluate":
        # Success, efficiency and completeness overall, per group and per task type.
        tracker.log_metrics(parent, {k.removeprefix("metrics/"): v for k, v in numeric_metrics(final).items()
                                     if k.startswith("metrics/")})
        tracker.finish(parent)
        return final
    tracker.log_metrics(parent, mlflow_runs.parent_metrics(final))
    has_curves = mlflow_runs.log_reward_curves(tracker, stages, selected)
    if evaluate is not None:
        tracker.log_artifacts(parent, [Path(evaluate.out) / "reward_curves.png"])
    status = mlflow_runs.cache_status(selected, cached)
    run = tracker.client.get_run(parent)
    children = mlflow_runs.stage_run_ids(tracker)
    flow_run = run.data.tags.get("prefect.flow_run_id", "")
    recipe_name = recipe.name if recipe else run.data.tags.get("recipe", "")
    signatures = failure_signatures(final)
    tracker.set_tags(parent, {
        "cached_stages": ",".join(cached), CACHE_TAG: status.split(" (")[0],
        **({SIGNATURES_TAG: "\n".join(signatures)} if signatures else {}),
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
                log_cached_stage(tracker, stages[name], read_summary(Path(stages[name].out)), dispatching=True)
            cached += group
            continue
        for name in group:
            sp = stages[name]
            if kind_of(sp.kind).needs_tracking and not _store_answers(tracker):
                progress.say(progress.stage_line(name, "skipped", note="the MLflow store is lost; the rerun does it"))
                continue
            state = STAGE_TASKS[sp.kind].with_options(name=name)(sp.to_dict(), tracker, return_state=True)
            result = state.result()  # raises the stage's own error when it failed
            if state.name == "Cached":
                cached.append(name)
                log_cached_stage(tracker, sp, result["summary"])
            if after is not None:
                after(sp, result["summary"])
    return cached


def _store_answers(tracker: Tracker) -> bool:
    """Whether the run's MLflow store answers now (a lost one is said once, at the run's end)."""
    try:
        ensure_answers(tracker.uri)
    except TrackingUnavailable:
        return False
    return not lost_line(tracker.uri)


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


def run_plan(stages: Plan, *, only: list[str] | None = None, refresh: list[str] | None = None,
             parent_run_id: str | None = None, dispatch: Dispatch | None = None) -> dict[str, Any]:
    """Run a plan's selected stages (all by default): here, one Prefect task each, or with
    ``dispatch`` on the pools; ``refresh`` recomputes stages and what reads them. With
    ``parent_run_id`` the stages are children of a run another flow opened (and finishes)."""
    recipe, root = recipe_of(stages), stages.root
    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        selected = stages.select(only)
        refreshed = discard_refreshed(stages, refresh or [])
        discard_damaged(stages, selected)
        tracker = open_tracker(recipe, root, "+".join(selected) if only else "pipeline",
                               selected, refreshed, parent_run_id, stages)

        def after(sp: StagePlan, summary: dict[str, Any]) -> None:
            if sp.kind == "preprocess" and "promote" in selected:
                from embodied_r.lifecycle.promote import check_promotion_split

                check_promotion_split(recipe, summary)  # before hours of work, not after

        try:
            cached = run_stages(stages, selected, tracker, dispatch=dispatch, after=after)
        except BaseException:
            if not parent_run_id:
                with tracker.guard("the end of the run"):
                    tracker.finish(tracker.parent_run_id, "FAILED")
            raise
        final = {}
        if not parent_run_id:
            final = evaluation_summary(stages)
            with tracker.guard("the end of the run"):
                finish_parent(tracker, stages, cached, selected, recipe, registered_label(stages))
        return {"mlflow_run_id": tracker.parent_run_id, "tracking_uri": uri, "cached": cached,
                "tracking_lost": lost_line(uri),
                "experiment_id": tracker.experiment_id,
                "mlflow_run_url": mlflow_runs.run_url(uri, tracker.experiment_id, tracker.parent_run_id or ""),
                "mlflow_runs_url": mlflow_runs.runs_url(uri, tracker.experiment_id),
                "stages": {n: stages[n].out for n in selected}, "evaluation": final,
                "promotion": promotion_line(stages, cached), "dispatched": dispatch is not None}
