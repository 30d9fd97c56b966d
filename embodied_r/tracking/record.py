"""A pipeline run's record in MLflow, made from the run loop's events (``Recorder``): a parent
run holding the plan, a child per stage (a cached one linking to and copying the run that did
the work), and at the end the parent's figures, name, description and report."""

from __future__ import annotations

import importlib
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from embodied_r import progress
from embodied_r.io import read_summary
from embodied_r.stage_plan import Plan, StagePlan
from embodied_r.tracking.link import DEFAULT_OUTAGE_S, link, lost_line, outage_line
from embodied_r.tracking.names import (CACHE_TAG, HEADLINE, SIDEBAR_HINT, SIGNATURES_TAG, cache_status, finished_name,
                                       headline_metrics, numeric_metrics, parent_name, prefect_flow_run_url,
                                       run_list_path, run_path, run_url, runs_url, safe_params, ui_path)
from embodied_r.tracking.runs import STAGE_ARTIFACTS, STAGE_TABLES, Tracker, record_stage
from embodied_r.errors import TrackingUnavailable
from embodied_r.tracking.store import tracking_uri, unanswered

def source_run(tracker: Tracker, sp: StagePlan) -> Any | None:
    """The first finished run that computed this stage's output (same stage key, not a cache hit)."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        filter_string=f"tags.stage_key = '{sp.key}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time ASC"], max_results=50)
    return next((r for r in runs if r.data.tags.get("cache_hit") != "true"), None)


def copy_history(tracker: Tracker, source_id: str, run_id: str) -> int:
    """Every metric's full history (steps included) from ``source_id`` into ``run_id``."""
    client = tracker.client
    points = []
    for key in client.get_run(source_id).data.metrics:
        points += [(m.key, m.value, m.timestamp, m.step) for m in client.get_metric_history(source_id, key)]
    tracker.log_points(run_id, points, batch=1000)
    return len(points)


def copy_extra_artifacts(tracker: Tracker, source_id: str, run_id: str) -> None:
    """Files the source logged that are not in the stage folder (the completions table)."""
    import json

    client = tracker.client
    from_folder = set(STAGE_ARTIFACTS) | set(STAGE_TABLES)
    extra = [a.path for a in client.list_artifacts(source_id) if not a.is_dir and a.path not in from_folder]
    if not extra:
        return
    try:
        logged = json.loads(client.get_run(source_id).data.tags.get("mlflow.loggedArtifacts", "[]"))
    except ValueError:
        logged = []
    tables = {t["path"] for t in logged if t.get("type") == "table"}
    with tempfile.TemporaryDirectory() as tmp:
        for name in extra:
            local = Path(client.download_artifacts(source_id, name, tmp))
            if name in tables:
                tracker.log_table(run_id, local, name)
            else:
                tracker.log_artifacts(run_id, [local])


def stage_params(sp: StagePlan, kind: Any) -> dict[str, Any]:
    """A stage whose trainer reports its own arguments into its run (``trainer.``) keeps its
    recipe settings under its kind's name, to read apart."""
    return {sp.kind: sp.config} if kind.self_reporting else sp.config


def log_cached_stage(tracker: Tracker, sp: StagePlan, kind: Any, summary: dict[str, Any],
                     signatures: Sequence[str] = ()) -> str:
    """A stage served from the cache still gets a complete child run: its params, the metric
    history and artifacts of the run that computed it, and a ``source_run_id`` link to that
    run. Returns the source run's id ("" when no run of this store made it)."""
    source = source_run(tracker, sp)
    source_id = source.info.run_id if source is not None else ""
    run_id = tracker.start_stage(sp.name, stage_params(sp, kind), tags={
        "stage_key": sp.key, "output": sp.out, "cache_hit": "true", "source_run_id": source_id})
    if source is not None:
        copy_history(tracker, source_id, run_id)
        # What the trainer logged of its own arguments (``trainer.``), so the copy reads as the original.
        own = safe_params(stage_params(sp, kind))
        tracker.log_params(run_id, {k: v for k, v in source.data.params.items() if k not in own})
        tracker.set_tags(run_id, {"mlflow.note.content": (
            f"Served from the cache: the output was computed by run [{source.info.run_name}]"
            f"({run_path(tracker.experiment_id, source_id)}); its metrics, params and files are copied here.")})
    record_stage(tracker, run_id, Path(sp.out), summary, kind.summary_as_params)
    if signatures:
        tracker.set_tags(run_id, {SIGNATURES_TAG: "\n".join(signatures)})
    if source is not None:
        copy_extra_artifacts(tracker, source_id, run_id)
    tracker.finish(run_id)
    return source_id


def stage_run_ids(tracker: Tracker) -> dict[str, str]:
    children = tracker.client.search_runs(
        [tracker.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{tracker.parent_run_id}'")
    return {c.data.tags.get("stage", c.info.run_name): c.info.run_id for c in children}


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


def registered_run(tracker: Tracker, registered: str) -> str:
    """The run a registered version (``name vN``) was logged under; "" when unknown."""
    name, _, version = registered.rpartition(" v")
    if not name or not version.isdigit():
        return ""
    try:
        return tracker.client.get_model_version(name, version).run_id or ""
    except Exception:  # noqa: BLE001 - the description then names the version only
        return ""


def parent_note(*, recipe: str, status: str, final: dict[str, Any], split: str, experiment_id: str,
                children: dict[str, str], run_id: str = "", registered: str = "", registered_by: str = "",
                has_curves: bool = False, prefect_url: str = "", flow_run: str = "",
                learning: list[str] | None = None) -> str:
    """The parent run's description: the headline accuracies, the learning block, the registered
    model, and links into the model-training view."""
    lines = [f"**{status}** run of recipe `{recipe}`", ""]
    heads = [f"{k.split('/', 1)[1]} **{100 * final[k]:.1f} %**" for k in HEADLINE
             if isinstance(final.get(k), (int, float))]
    if heads:
        lines += [f"Accuracy on the `{split}` split ({int(final.get('count/overall', 0))} questions): "
                  + ", ".join(heads), ""]
    if learning:
        lines += [f"**Learning** (`{split}` accuracy of each policy, 95 % interval, beside chance):", ""]
        lines += learning + [""]
    if registered:
        name, _, version = registered.rpartition(" v")
        model = f"[{registered}]({ui_path(f'models/{name}/versions/{version}')})"
        lines += [f"Registered model: {model}" + (
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


def _view(named: str | None, final: StagePlan, summary: dict[str, Any], selected: list[StagePlan],
          header: dict[str, str]) -> dict:
    """What the final stage's kind shows on the parent (``named``, its ``StageKind.parent_view``):
    the figures it charts, the reward curves, the learning lines and signatures, the report."""
    if not named:
        return {}
    module, function = named.split(":")
    return getattr(importlib.import_module(module), function)(final, summary, selected, header)


def finish_parent(tracker: Tracker, stages: dict[str, StagePlan], cached: list[str], selected: list[str],
                  final: StagePlan | None, view: str | None, recipe: str, registered: str = "") -> None:
    """Copy the evaluation's headline and learning figures and the stages' rewards onto the parent
    run, name it by its cache status, write its description and report, and close it. A final
    kind that shows nothing of its own gives the parent its ``metrics/`` figures alone."""
    summary = read_summary(Path(final.out)) if final is not None and final.complete else {}
    parent = tracker.parent_run_id or ""
    if final is not None and not view:
        tracker.log_metrics(parent, {k.removeprefix("metrics/"): v for k, v in numeric_metrics(summary).items()
                                     if k.startswith("metrics/")})
        tracker.finish(parent)
        return
    run = tracker.client.get_run(parent)
    status = cache_status(selected, cached)
    recipe = recipe or run.data.tags.get("recipe", "")
    name = finished_name(run.info.run_name, status)
    header = {"run": f"{name} ({run.info.run_id})", "recipe": recipe, "model version": registered or "not registered"}
    shown = _view(view, final, summary, [stages[n] for n in selected], header) if final is not None else {}
    figures = {k: v for k, v in numeric_metrics(summary).items() if k in HEADLINE}
    tracker.log_metrics(parent, {**figures, **shown.get("figures", {}), **headline_metrics(summary)})
    now = int(time.time() * 1000)
    tracker.log_points(parent, [(metric, value, now, step) for metric, step, value in shown.get("curves", [])], 1000)
    if final is not None:
        tracker.log_artifacts(parent, [Path(final.out) / "reward_curves.png"])
    flow_run = run.data.tags.get("prefect.flow_run_id", "")
    signatures = shown.get("signatures", [])
    tracker.set_tags(parent, {
        "cached_stages": ",".join(cached), CACHE_TAG: status.split(" (")[0],
        **({SIGNATURES_TAG: "\n".join(signatures)} if signatures else {}),
        "mlflow.note.content": parent_note(
            recipe=recipe, status=status, final=summary, split=str(summary.get("split", "")),
            experiment_id=tracker.experiment_id, children=stage_run_ids(tracker), run_id=parent,
            registered=registered, registered_by=registered_run(tracker, registered),
            has_curves=bool(shown.get("curves")), prefect_url=prefect_flow_run_url(flow_run), flow_run=flow_run,
            learning=shown.get("learning"))})
    tracker.rename(parent, name)
    if summary and shown.get("report"):
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.md"
            report.write_text(shown["report"], encoding="utf-8")
            tracker.log_artifacts(parent, [report, Path(final.out) / "accuracy_by_task.png"])
    tracker.finish(parent)


def flow_run_id() -> str:
    try:
        from prefect.context import get_run_context

        return str(get_run_context().flow_run.id)
    except Exception:  # noqa: BLE001 - outside a flow run
        return ""


class Recorder:
    """A run's record in MLflow from the run loop's events (``run_started``, ``stage_started``,
    ``stage_finished``/``stage_failed``/``stage_cached``, ``run_finished``). With ``parent_run_id``
    its stages are children of another flow's run. A store lost on the way is said once."""

    def __init__(self, stages: Plan, kinds: Callable[[str], Any], parent_run_id: str | None = None):
        # ``kinds``: a stage kind's declaration by name (``stage_kinds.kind_of``), which the run
        # loop hands in: what a kind's run records is its declaration's to say.
        self.kinds = kinds
        # The Embodied-Reasoner's recipe keeps its two settings at its top.
        settings = stages.recipe.get("tracking", stages.recipe)
        self.stages, self.own = stages, not parent_run_id
        self.uri = tracking_uri(settings.get("tracking_uri"), stages.root)
        self.experiment = settings.get("experiment", "embodied-r")
        self.outage_s = float(settings.get("outage_s", DEFAULT_OUTAGE_S))
        self.tracker = Tracker(self.uri, "", parent_run_id)
        self.selected: list[str] = []
        self.started = time.time()

    @property
    def parent_run_id(self) -> str:
        return self.tracker.parent_run_id or ""

    @property
    def environment(self) -> dict[str, str]:
        """What the stages' own processes (trainer children) log with."""
        return {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}

    def run_started(self, selected: list[str], refreshed: list[str], chosen: bool = False) -> None:
        """The parent run (named by the ``chosen`` stages, holding ``plan.json``), or a dispatching flow's
        (whose store, found gone, is lost for this run too: the stages run untracked)."""
        self.selected, self.started = selected, time.time()
        try:
            tracker = Tracker.open(self.experiment, self.uri, self.stages.root, self.outage_s)
        except TrackingUnavailable:
            if self.own:
                raise
            link(self.uri).lose(unanswered(self.uri) or "no answer")
            return
        if not self.own:
            self.tracker = Tracker(self.uri, tracker.experiment_id, self.parent_run_id)
            return
        name = self.stages.recipe_name
        self.tracker = tracker.start_parent(
            name=parent_name(name, selected if chosen else None),
            tags={"prefect.flow_run_id": flow_run_id(), "recipe": name, "stages": ",".join(selected),
                  "refresh": ",".join(refreshed), "pipeline": self.stages.pipeline},
            params={"recipe": self.stages.recipe})
        with self.tracker.guard("the plan"), tempfile.TemporaryDirectory() as tmp:
            self.tracker.log_artifacts(self.parent_run_id, [self.stages.save(Path(tmp))])

    def blocked(self, sp: StagePlan) -> str:
        """Why a stage whose result lives in the store (``StageKind.needs_tracking``) cannot run
        now: the store is lost (a server away is waited for up to ``tracking.outage_s``)."""
        if not self.kinds(sp.kind).needs_tracking:
            return ""
        with self.tracker.guard(sp.name):
            link(self.uri).ready()
            return ""
        return "the MLflow store is lost; the rerun does it"

    def stage_started(self, sp: StagePlan) -> str | None:
        """The stage's child run (its id goes to the stage, whose trainer logs its steps there)."""
        with self.tracker.guard(sp.name):
            return self.tracker.start_stage(sp.name, stage_params(sp, self.kinds(sp.kind)),
                                            tags={"stage_key": sp.key, "output": sp.out})
        return None

    def stage_finished(self, sp: StagePlan, run_id: str | None, summary: dict[str, Any], signatures: list[str]) -> None:
        if not run_id:
            return
        with self.tracker.guard(sp.name):
            record_stage(self.tracker, run_id, Path(sp.out), summary, self.kinds(sp.kind).summary_as_params)
            if signatures:
                self.tracker.set_tags(run_id, {SIGNATURES_TAG: "\n".join(signatures)})
            self.tracker.finish(run_id)
            link(self.uri).drain_orphans()  # what the stage's trainer child kept, once it ended

    def stage_failed(self, sp: StagePlan, run_id: str | None) -> None:
        if run_id:
            with self.tracker.guard(sp.name):
                self.tracker.finish(run_id, "FAILED")

    def stage_cached(self, sp: StagePlan, summary: dict[str, Any], signatures: list[str]) -> str:
        """The child of a stage served from its folder; what the console says of it."""
        with self.tracker.guard(sp.name):
            if source := log_cached_stage(self.tracker, sp, self.kinds(sp.kind), summary, signatures):
                return f"from run {source[:8]}"
        return "output found on disk"

    def run_finished(self, cached: list[str] | None, final: StagePlan | None = None) -> dict[str, Any]:
        """Close the parent (FAILED when ``cached`` is None: the run stopped, and what is kept
        waits for the rerun), once every kept write is sent; what the run's result says of it."""
        store = link(self.uri)
        with self.tracker.guard("the end of the run"):
            if cached is None:
                if self.own and self.parent_run_id:
                    self.tracker.finish(self.parent_run_id, "FAILED")
                return {}
            if self.own and self.parent_run_id and not store.lost:
                store.ready()
                self.tracker = Tracker(self.uri, self.tracker.experiment_id, store.real(self.parent_run_id))
                finish_parent(self.tracker, self.stages, cached, self.selected, final,
                              self.kinds(final.kind).parent_view if final is not None else None,
                              self.stages.recipe_name, registered_label(self.stages))
            store.settle()
        if cached is None:
            return {}
        if line := outage_line(self.uri, self.started):
            progress.say(line)
        experiment, run_id = self.tracker.experiment_id, self.parent_run_id
        return {"mlflow_run_id": run_id or None, "tracking_uri": self.uri, "tracking_lost": lost_line(self.uri),
                "experiment_id": experiment, "mlflow_run_url": run_url(self.uri, experiment, run_id),
                "mlflow_runs_url": runs_url(self.uri, experiment),
                "promotion": promotion_line(self.stages, cached)}
