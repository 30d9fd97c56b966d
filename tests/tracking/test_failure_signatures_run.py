"""The method's failure signatures planted in a run and found where a user looks: on the
terminal as the training stage ends, on its MLflow stage run, again when a rerun serves the
stage from the cache, and on the parent run after the evaluation.

Two are planted: a GRPO stage whose accuracy reward rises while the consistent share of its
right answers falls (memorising, and under 80 %: reward hacking), and an evaluation whose
judge reaches few answers from their reasoning. No tiny model learns to hack its reward in a
few steps, so the trainer is a stand-in that leaves the planted log history, reduced to
quarters by the trainer's own ``quarter_stats``. Everything after it is the project's own
code: the stage task, a real MLflow store, the learning figures and the parent run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REWARDS = ["format_reward", "accuracy_reward", "consistency_reward"]
STEPS = 8


def _history(accuracy: tuple[float, float], consistency: tuple[float, float]) -> list[dict[str, Any]]:
    """A trainer's log history: the accuracy and consistency rewards move linearly from the
    first value to the last over the steps; the format reward stays at 1."""
    def at(pair: tuple[float, float], step: int) -> float:
        return pair[0] + (pair[1] - pair[0]) * (step - 1) / (STEPS - 1)

    return [{"step": s, "reward": 1.0, "rewards/format_reward/mean": 1.0,
             "rewards/accuracy_reward/mean": at(accuracy, s),
             "rewards/consistency_reward/mean": at(consistency, s)} for s in range(1, STEPS + 1)]


def _stand_in_trainer(history: list[dict[str, Any]]):
    """The stage's runner, standing in for the GRPO child: it writes what a finished stage
    writes, with the planted history and its quarters as the trainer computes them."""
    from embodied_r.io import write_summary
    from embodied_r.training.learning import quarter_stats

    def execute(sp: Any, mlflow_run_id: str | None = None) -> dict[str, Any]:
        out = Path(sp.out)
        out.mkdir(parents=True)
        summary = {"steps": STEPS, "epochs_reached": 0.5, "stopped_by": "step cap", "reward_funcs": REWARDS,
                   "quarters": quarter_stats(history, REWARDS)}
        (out / "history.json").write_text(json.dumps({"reward_funcs": REWARDS, "history": history}))
        write_summary(out, summary)
        return summary

    return execute


@pytest.fixture()
def store(tmp_path: Path):
    from embodied_r.tracking.runs import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return Tracker.open("signatures", uri, tmp_path)


def _recorder(store: Any, root: Path, *stages: Any) -> Any:
    """The run's recorder over a plan of ``stages``, its parent run started."""
    from embodied_r.stage_plan import Plan
    from embodied_r.stage_kinds import kind_of
    from embodied_r.tracking.record import Recorder

    plan = Plan({sp.name: sp for sp in stages}, pipeline="embodied-r", root=root,
                recipe={"name": "signatures", "tracking": {"tracking_uri": store.uri, "experiment": "signatures"}})
    recorder = Recorder(plan, kind_of)
    recorder.run_started(list(plan), [])
    return recorder


def _tags(tracker: Any, run_id: str) -> dict[str, str]:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracker.uri).get_run(run_id).data.tags


def test_a_memorising_stage_is_named_as_it_ends_and_on_its_runs(tmp_path: Path, store: Any, capsys,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.stages
    from embodied_r.pipeline import StagePlan
    from embodied_r.tracking.record import stage_run_ids
    from flows.runner import say_cached

    # Accuracy 40 % -> 70 %; the consistency reward (paid for right answers only) 36 % -> 42 %:
    # the consistent share of right answers falls from 90 % to 60 %.
    monkeypatch.setattr(tasks.stages, "execute", _stand_in_trainer(_history((0.40, 0.70), (0.36, 0.42))))
    sp = StagePlan("train_stage3", "train", "k3", str(tmp_path / "stages" / "train_stage3" / "k3"), ())
    run_id = tasks.stages.run_stage(sp.to_dict(), _recorder(store, tmp_path, sp))["mlflow_run_id"]
    out = capsys.readouterr().out
    done = out.index("[stage] train_stage3  done")
    said = [line for line in out[done:].splitlines() if line.startswith("Failure signature")]
    assert len(said) == 2, out
    assert said[0].startswith("Failure signature, stage3: the reference reaches ")
    assert "under 80.0 %" in said[0] and "(reward hacking)" in said[0]
    assert "the accuracy reward rose (" in said[1] and "(memorising)" in said[1]
    assert _tags(store, run_id)["failure_signatures"].splitlines() == said

    # A rerun finds the stage done: its cached stage run says the same, on the terminal too.
    rerun = _recorder(store, tmp_path, sp)
    say_cached(rerun, sp, json.loads((Path(sp.out) / "summary.json").read_text()))
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("Failure signature")] == said
    cached = stage_run_ids(rerun.tracker)["train_stage3"]
    assert _tags(store, cached)["failure_signatures"].splitlines() == said


def test_a_healthy_stage_says_nothing(tmp_path: Path, store: Any, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    import tasks.stages
    from embodied_r.pipeline import StagePlan

    # Both rise, and nine right answers in ten are consistent throughout.
    monkeypatch.setattr(tasks.stages, "execute", _stand_in_trainer(_history((0.40, 0.70), (0.36, 0.63))))
    sp = StagePlan("train_stage3", "train", "k3", str(tmp_path / "stages" / "train_stage3" / "k3"), ())
    run_id = tasks.stages.run_stage(sp.to_dict(), _recorder(store, tmp_path, sp))["mlflow_run_id"]
    assert "Failure signature" not in capsys.readouterr().out
    assert "failure_signatures" not in _tags(store, run_id)


def test_a_run_whose_judged_consistency_is_forced_low_says_so_on_its_parent(tmp_path: Path, store: Any,
                                                                           capsys) -> None:
    """The evaluation's learning figures are written by its own ``write_learning`` from the
    stage folders; its judged ratio is forced to 62 %. The parent run and the console's
    learning block both name the two signatures of the stage and the evaluation's."""
    from embodied_r.evaluation.learning import write_learning
    from embodied_r.evaluation.report import write_report
    from embodied_r.apps.cli import _print_learning
    from embodied_r.io import read_summary, write_summary
    from embodied_r.pipeline import StagePlan
    from embodied_r.stage_kinds import kind_of
    from embodied_r.tracking.record import finish_parent
    from embodied_r.training.learning import quarter_stats

    train = tmp_path / "stages" / "train_stage3" / "k3"
    train.mkdir(parents=True)
    history = _history((0.40, 0.70), (0.36, 0.42))
    (train / "history.json").write_text(json.dumps({"reward_funcs": REWARDS, "history": history}))
    write_summary(train, {"steps": STEPS, "quarters": quarter_stats(history, REWARDS)})
    evaluate = tmp_path / "stages" / "evaluate" / "ke"
    evaluate.mkdir(parents=True)
    records = [{"uid": f"q{i}", "options": ["A. x", "B. y", "C. z", "D. w"], "answer": "A"} for i in range(40)]
    metrics = {"split": "test", "accuracy/overall": 0.5, "count/overall": 40, "accuracy/macro": 0.5,
               "consistency/ratio": 0.62}
    categories = [{"benchmark": "urbanvideo", "category": "Action Generation", "count": 40, "score_sum": 20.0,
                   "accuracy": 0.5}]
    (evaluate / "metrics.json").write_text(json.dumps({"categories": categories, "metrics": metrics, "chance": {}}))
    write_report(evaluate, categories, metrics, model="stage3/model", split="test")
    figures = write_learning(evaluate, records, metrics, {}, {"train_stage3": str(train)})
    write_summary(evaluate, {**metrics, **figures})
    stages = {"train_stage3": StagePlan("train_stage3", "train", "k3", str(train), ()),
              "evaluate": StagePlan("evaluate", "evaluate", "ke", str(evaluate), ("train_stage3",),
                                    config={"split": "test"})}
    run = store.start_parent("fresh", {}, {})
    finish_parent(run, stages, [], list(stages), stages["evaluate"], kind_of("evaluate").parent_view, "")
    final = read_summary(evaluate)
    lines = _tags(store, run.parent_run_id)["failure_signatures"].splitlines()
    assert [line.split(":")[0] for line in lines] == ["Failure signature, evaluation"] + 2 * ["Failure signature, stage3"]
    assert lines[0].startswith("Failure signature, evaluation: the judge reaches 62.0 % of the answers")
    _print_learning(final)
    printed = capsys.readouterr().out
    assert all(line in printed for line in lines), printed
