"""Two pipeline runs of a recipe in a real MLflow store, as the flow leaves them (a fresh one
that trained, registered and evaluated, then a cached one), with the stage folders the parent
run reads: three GRPO stages' ``history.json`` and ``summary.json`` on the trainers' global
step after a warm start, and an evaluate folder with its report and learning figures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WARMSTART_STEPS = 8  # the first GRPO step is global step 9, as after the demo's warm start
STEPS = 4  # per GRPO stage
REWARDS = ("format_reward", "accuracy_reward")

CATEGORIES = [
    {"benchmark": "urbanvideo", "category": "Action Generation", "count": 30, "score_sum": 9.0, "accuracy": 0.3},
    {"benchmark": "vsibench", "category": "route_planning", "count": 1, "score_sum": 1.0, "accuracy": 1.0},
]
FINAL: dict[str, Any] = {
    "split": "test", "model": "stage3/model", "accuracy/overall": 10 / 31, "count/overall": 31,
    "accuracy/macro": 0.65, "accuracy/paper_tasks": 10 / 31, "count/paper_tasks": 31,
    "accuracy/action_generation": 0.3, "count/action_generation": 30,
    "accuracy/route_planning": 1.0, "count/route_planning": 1,
    "learning/accuracy/untrained": 0.0, "learning/accuracy/warmstart": 0.2258,
    "learning/accuracy/trained": 10 / 31, "learning/accuracy/chance": 0.2727,
    "learning/accuracy/untrained_ci_low": 0.0, "learning/accuracy/untrained_ci_high": 0.11,
    "learning/accuracy/warmstart_ci_low": 0.114, "learning/accuracy/warmstart_ci_high": 0.40,
    "learning/accuracy/trained_ci_low": 0.186, "learning/accuracy/trained_ci_high": 0.50,
    "learning/accuracy/chance_ci_low": 0.15, "learning/accuracy/chance_ci_high": 0.40,
    "learning/stage1/format_reward/first_quarter": 0.5, "learning/stage1/format_reward/last_quarter": 0.9,
}


@dataclass
class Runs:
    uri: str
    experiment_id: str
    fresh: str  # parent run ids
    cached: str
    stages: dict[str, Any]


def _stage_folders(root: Path) -> dict[str, Any]:
    from embodied_r.pipeline import StagePlan

    stages: dict[str, StagePlan] = {}
    for index in (1, 2, 3):
        name = f"train_stage{index}"
        out = root / "stages" / name / "k"
        out.mkdir(parents=True)
        offset = WARMSTART_STEPS + (index - 1) * STEPS
        history = [{"step": s, "reward": 0.1 * index + 0.01 * s,
                    **{f"rewards/{r}/mean": 0.2 * index for r in REWARDS}} for s in range(1, STEPS + 1)]
        (out / "history.json").write_text(json.dumps({"history": history, "reward_funcs": list(REWARDS)}))
        (out / "summary.json").write_text(json.dumps({"steps": STEPS, "global_step_offset": offset,
                                                      "global_step_end": offset + STEPS, "stage_index": index}))
        stages[name] = StagePlan(name, "train", f"k{index}", str(out), (), config={})
    out = root / "stages" / "evaluate" / "k"
    out.mkdir(parents=True)
    (out / "summary.json").write_text(json.dumps(FINAL))
    (out / "metrics.json").write_text(json.dumps({"categories": CATEGORIES, "metrics": FINAL, "chance": {}}))
    from embodied_r.evaluation.learning import plot_reward_curves
    from embodied_r.evaluation.report import write_report

    write_report(out, CATEGORIES, FINAL, model="stage3/model", split="test")
    plot_reward_curves({n: stages[n].out for n in stages}, out / "reward_curves.png")
    stages["evaluate"] = StagePlan("evaluate", "evaluate", "ke", str(out), (), config={"split": "test"})
    return stages


def make_runs(root: Path) -> Runs:
    """A fresh and a cached parent run, each with a child per stage, finished by the recorder's own
    ``finish_parent``; the trained model is registered under the fresh parent."""
    from embodied_r.evaluation.learning import training_signatures
    from embodied_r.io import is_complete
    from embodied_r.tracking.names import parent_name
    from embodied_r.stage_kinds import kind_of
    from embodied_r.tracking.record import finish_parent, log_cached_stage
    from embodied_r.tracking.runs import Tracker

    stages = _stage_folders(root)
    assert all(is_complete(Path(sp.out)) for sp in stages.values()), "stage folders must read as done"
    tracker = Tracker.open("embodied-r", f"sqlite:///{root / 'mlflow.db'}", root)
    parents = []
    for cached in ([], list(stages)):
        run = tracker.start_parent(parent_name("demo"), {"recipe": "demo"}, {"recipe": {"name": "demo"}})
        for name, sp in stages.items():
            if cached:
                summary = json.loads((Path(sp.out) / "summary.json").read_text())
                log_cached_stage(run, sp, kind_of(sp.kind), summary, training_signatures(name, summary))
                continue
            child = run.start_stage(name, {"x": 1}, tags={"stage_key": sp.key})
            for step in range(1, 3):
                run.log_metrics(child, {"reward/total": 0.1 * step}, step=step)
            run.finish(child)
        registered = ""
        if not cached:
            client = run.client
            client.create_registered_model("embodied-r-reasoner")
            version = client.create_model_version("embodied-r-reasoner", source=f"runs:/{run.parent_run_id}/model",
                                                  run_id=run.parent_run_id)
            registered = f"embodied-r-reasoner v{version.version}"
        else:
            registered = "embodied-r-reasoner v1"
        finish_parent(run, stages, cached, list(stages), stages["evaluate"], kind_of("evaluate").parent_view, "",
                      registered)
        parents.append(run.parent_run_id)
    return Runs(tracker.uri, tracker.experiment_id, parents[0], parents[1], stages)
