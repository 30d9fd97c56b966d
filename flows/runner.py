"""The one run loop of both pipelines (``run_plan``, over ``run_stages``), here or on the pools:
it tells an observer what happens (``tasks.stages.Observer``). The plan is built once, where the
run starts (``plan_of``); a stage folder is the one record of "done": a complete stage runs
nothing and is sent nowhere."""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from prefect import get_run_logger

from embodied_r import progress
from embodied_r.errors import DamagedOutput, StageRunFailed
from embodied_r.io import damaged_outputs, partial_path, read_summary
from embodied_r.evaluation.learning import training_signatures
from embodied_r.shards import shard_paths
from embodied_r.stage_kinds import kind_of
from embodied_r.stage_plan import Plan, StagePlan, downstream
from flows.waiting import wait_for_runs
from tasks.stages import STAGE_TASKS, Observer, say_signatures


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
    """Discard a finished folder the run relies on that lost an output (``io.damaged_outputs``),
    with its finished dependants, saying so in one line; where that would redo GPU-pool work or a
    stage outside the run, stop instead, naming ``--refresh``. Returns the stages discarded."""
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


@contextmanager
def scoped_env(**values: str) -> Iterator[None]:
    """Stages that run subprocesses (training) find the home and what the observer asks for
    through the environment; restore it afterwards so one process can run several pipelines."""
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
    """The validated recipe ``stages`` was planned from: validated again only in another process."""
    from embodied_r.stage_plan import validated_recipe

    if (known := validated_recipe(stages)) is not None:
        return known
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


def say_cached(observer: Observer, sp: StagePlan, summary: dict[str, Any], dispatching: bool = False) -> None:
    """A stage served from the cache: the observer is told, and it gets a line on the terminal
    and in Prefect's log; a dispatching run says it sent it nowhere."""
    signatures = training_signatures(sp.name, summary)
    note = observer.stage_cached(sp, summary, signatures)
    if dispatching:
        note += f"; not sent to pool {kind_of(sp.kind).pool}"
    progress.say(progress.stage_line(sp.name, "cached", note=note))
    try:
        get_run_logger().info("%s: served from the cache (%s): %s", sp.name, note, sp.out)
    except Exception:  # noqa: BLE001 - outside a flow run
        pass
    say_signatures(signatures)


def final_stage(stages: dict[str, StagePlan]) -> StagePlan | None:
    """The stage whose summary is the run's result: the last evaluation."""
    return next((stages[n] for n in reversed(list(stages)) if stages[n].kind in ("evaluate", "reasoner_evaluate")),
                None)


# Sends one kind's stages elsewhere and waits for them: ``(kind, names)``.
Dispatch = Callable[[str, list[str]], None]


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


def run_stages(stages: dict[str, StagePlan], selected: list[str], observer: Observer, *,
               dispatch: Dispatch | None = None,
               after: Callable[[StagePlan, dict[str, Any]], None] | None = None) -> list[str]:
    """Run the selected stages in order; return those served from their folders. Without
    ``dispatch`` each is its kind's task here (``after`` sees each summary); with it each group is
    sent away unless all its folders are complete (finished work needs no worker)."""
    cached: list[str] = []
    for group in stage_groups(stages, selected):
        if dispatch is not None:
            if not all(stages[n].complete for n in group):
                dispatch(stages[group[0]].kind, group)
                continue
            for name in group:
                say_cached(observer, stages[name], read_summary(Path(stages[name].out)), dispatching=True)
            cached += group
            continue
        for name in group:
            sp = stages[name]
            if why := observer.blocked(sp):
                progress.say(progress.stage_line(name, "skipped", note=why))
                continue
            state = STAGE_TASKS[sp.kind].with_options(name=name)(sp.to_dict(), observer, return_state=True)
            result = state.result()  # raises the stage's own error when it failed
            if state.name == "Cached":
                cached.append(name)
                say_cached(observer, sp, result["summary"])
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


def run_plan(stages: Plan, observer: Observer, *, only: list[str] | None = None, refresh: list[str] | None = None,
             dispatch: Dispatch | None = None) -> dict[str, Any]:
    """Run a plan's selected stages (all by default): here, one Prefect task each, or with
    ``dispatch`` on the pools; ``refresh`` recomputes stages and what reads them. ``observer``
    is told the run started, each stage's start and end, and the run's end."""
    with scoped_env(EMBODIED_R_HOME=str(stages.root), **observer.environment):
        selected = stages.select(only)
        refreshed = discard_refreshed(stages, refresh or [])
        discard_damaged(stages, selected)
        observer.run_started(selected, refreshed, chosen=bool(only))

        def after(sp: StagePlan, summary: dict[str, Any]) -> None:
            if sp.kind == "preprocess" and "promote" in selected:
                from embodied_r.lifecycle.promote import check_promotion_split

                check_promotion_split(recipe_of(stages), summary)  # before hours of work, not after

        try:
            cached = run_stages(stages, selected, observer, dispatch=dispatch, after=after)
        except BaseException:
            observer.run_finished(None)
            raise
        final = final_stage(stages)
        return {**observer.run_finished(cached, final), "cached": cached,
                "stages": {n: stages[n].out for n in selected},
                "evaluation": read_summary(Path(final.out)) if final is not None and final.complete else {},
                "dispatched": dispatch is not None}
