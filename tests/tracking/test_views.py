"""What a researcher sees: metric names and groups, terminal lines, the report's legend and
intervals, cached child runs in a real MLflow store, and the registered reasoner in MLflow's
transformers flavour (loaded back with ``mlflow.transformers.load_model``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodied_r import progress
from embodied_r.evaluation.report import LEGEND, render_markdown, task_name
from embodied_r.tracking.names import (METRIC_GROUPS, RUN_LIST_VIEW_TAG, stage_metric_name,
                                       trainer_metric_name)
from embodied_r.tracking.runs import Tracker
from embodied_r.training.callbacks import sampled_steps, sft_step_record, step_record


def test_trainer_metrics_fall_into_named_groups() -> None:
    assert trainer_metric_name("reward") == "reward/total"
    assert trainer_metric_name("rewards/format_reward/mean") == "reward/format"
    assert trainer_metric_name("rewards/consistency_reward/std") == "reward/consistency_std"
    assert trainer_metric_name("kl") == "train/kl"
    assert trainer_metric_name("completions/mean_length") == "train/completions/mean_length"
    assert trainer_metric_name("profiling/Time taken: GRPOTrainer._calculate_rewards").startswith("timing/")
    # TRL's validation pass (``eval_steps``): its own group, never mixed into the training charts.
    assert trainer_metric_name("eval_reward") == "val/reward/total"
    assert trainer_metric_name("eval_rewards/accuracy_reward/mean") == "val/reward/accuracy"
    assert trainer_metric_name("eval_loss") == "val/loss"
    assert trainer_metric_name("eval_completions/mean_length") == "val/completions/mean_length"
    assert trainer_metric_name("eval_runtime") == "timing/eval_runtime"
    assert trainer_metric_name("eval_samples_per_second") == "timing/eval_samples_per_second"
    assert stage_metric_name("accuracy/overall") == "accuracy/overall"  # the run list's column
    assert stage_metric_name("count/overall") == "eval/count/overall"
    assert stage_metric_name("final_reward") == "summary/final_reward"
    assert stage_metric_name("seconds_per_step") == "timing/seconds_per_step"
    for key in ("loss", "grad_norm", "entropy", "step_time", "reward_std", "epoch", "rewards/x/mean",
                "eval_reward", "eval_kl", "eval_runtime"):
        assert trainer_metric_name(key).split("/", 1)[0] in METRIC_GROUPS


def test_completion_table_samples_several_steps_of_a_stage() -> None:
    assert sampled_steps(3, 50) == {1, 2, 3}
    assert sampled_steps(100, 1000) == {1, 34, 67, 100}
    assert sampled_steps(10, 5) >= {1, 5, 10}


def test_one_compact_line_per_training_step() -> None:
    metrics = {"reward/total": 0.41234, "reward/format": 0.5, "reward/format_std": 0.1,
               "reward/accuracy": 0.25, "train/kl": 0.00031, "train/loss": 0.01}
    line = progress.step_line(step_record(metrics, "train_stage2", 2, 3, 5))
    assert line.split() == ["train_stage2", "step", "2/3", "(global", "5)", "reward", "0.412", "format",
                            "0.500", "accuracy", "0.250", "kl", "0.0003"]
    assert "{" not in line
    sft = sft_step_record({"loss": 1.23456, "mean_token_accuracy": 0.5, "learning_rate": 3e-5, "epoch": 0.1},
                          "warmstart", 4, 10)
    assert progress.step_line(sft).split() == ["warmstart", "step", "4/10", "loss", "1.2346", "token", "acc",
                                               "0.500", "lr", "3.00e-05"]
    assert progress.step_line({**sft, "lr": None, "token_accuracy": None}).split()[-4:] == ["acc", "-", "lr", "-"]
    assert progress.stage_line("evaluate", "done", 12.34, "accuracy 50.0 %").split() == \
        ["[stage]", "evaluate", "done", "12.3", "s", "accuracy", "50.0", "%"]


def test_report_names_tasks_one_way_and_flags_small_ones() -> None:
    categories = [
        {"benchmark": "urbanvideo", "category": "Action Generation", "count": 40, "score_sum": 20.0, "accuracy": 0.5},
        {"benchmark": "vsibench", "category": "obj_appearance_order", "count": 2, "score_sum": 1.0, "accuracy": 0.5},
    ]
    metrics = {"count/overall": 42, "accuracy/overall": 0.5, "accuracy/macro": 0.5}
    md = render_markdown(categories, metrics, model="m", split="test",
                         header={"run": "demo 2026-01-01 10:00", "recipe": "demo", "model version": "r v3"},
                         chance={"Action Generation": 0.25})
    assert "- recipe: demo" in md and "- model version: r v3" in md
    assert "| vsibench | Appearance Order ⚠ | 2 |" in md and "obj_appearance_order" not in md
    assert "| urbanvideo | Action Generation | 40 | 50.0 | [35.2, 64.8] | 25.0 |" in md
    assert "fewer than 10 questions" in md and LEGEND in md
    assert task_name("route_planning") == "Route Planning"


@pytest.fixture()
def tracker(tmp_path: Path) -> Tracker:
    return Tracker.open("views", f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path)


def test_experiment_opens_on_the_run_list(tracker: Tracker, tmp_path: Path) -> None:
    from embodied_r.tracking.names import runs_url

    experiment = tracker.client.get_experiment(tracker.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert "parent run" in experiment.tags["mlflow.note.content"]
    # The saved view the printed link opens: the run list with the headline figures as columns
    # (the browser test sees them in the UI).
    view = json.loads(experiment.tags[RUN_LIST_VIEW_TAG])
    assert view["name"] and isinstance(view["createdAt"], int)
    assert json.loads(view["state"])["selectedColumns"] == [
        "metrics.`test/trained`", "metrics.`test/warmstart`", "metrics.`test/untrained`",
        "metrics.`test/chance`", "metrics.`test/questions`", "tags.`cache_status`"]
    url = runs_url(tracker.uri, tracker.experiment_id)
    assert url.endswith(f"/#/experiments/{tracker.experiment_id}/runs?workflowType=machine_learning"
                        f"&viewStateShareKey={RUN_LIST_VIEW_TAG.rsplit('.', 1)[1]}")
    # A view the user overwrote in the UI is kept when the experiment is opened again.
    tracker.client.set_experiment_tag(tracker.experiment_id, RUN_LIST_VIEW_TAG, "{}")
    again = Tracker.open("views", tracker.uri, tmp_path)
    assert again.client.get_experiment(again.experiment_id).tags[RUN_LIST_VIEW_TAG] == "{}"


def test_step_figures_reach_mlflow_in_batches_each_at_its_step(tracker: Tracker, monkeypatch, caplog) -> None:
    from embodied_r.training.callbacks import StepMetrics

    run = tracker.client.create_run(tracker.experiment_id).info.run_id
    writes: list[int] = []
    send = Tracker.log_steps
    monkeypatch.setattr(Tracker, "log_steps", lambda self, run_id, points: (writes.append(len(points)),
                                                                             send(self, run_id, points)))
    figures = StepMetrics(tracker, run, every_s=3600.0)
    for step in range(1, 6):
        figures.add({"train/loss": float(step)}, step)
    assert writes == []  # held until the interval has passed or training ends
    figures.flush()
    assert writes == [5]
    history = tracker.client.get_metric_history(run, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(1, 6)]
    StepMetrics(tracker, run, every_s=0.0).add({"train/loss": 9.0}, 9)  # no interval: sent at once
    assert writes == [5, 1]
    # A store that fails loses the batch with a warning; training goes on.
    monkeypatch.setattr(Tracker, "log_steps", lambda self, run_id, points: 1 / 0)
    lost = StepMetrics(tracker, run, every_s=3600.0)
    lost.add({"train/loss": 1.0}, 10)
    lost.flush()
    assert "could not log metrics of steps 10-10" in caplog.text


def test_a_cached_stage_links_to_and_copies_its_source_run(tracker: Tracker, tmp_path: Path) -> None:
    from embodied_r.pipeline import StagePlan
    from embodied_r.stage_kinds import kind_of
    from embodied_r.tracking.record import log_cached_stage

    out = tmp_path / "stages" / "evaluate" / "k1"
    out.mkdir(parents=True)
    (out / "report.md").write_text("# report\n")
    (out / "summary.json").write_text(json.dumps({"accuracy/overall": 0.5}))
    sp = StagePlan(name="evaluate", kind="evaluate", key="k1", out=str(out), deps=(), config={"split": "test"})
    first = tracker.start_parent("p1", {}, {})
    source = first.start_stage("evaluate", sp.config, tags={"stage_key": "k1"})
    for step in range(3):
        first.log_metrics(source, {"reward/total": 0.1 * step}, step=step)
    table = tmp_path / "completions.json"
    table.write_text(json.dumps({"columns": ["step"], "data": [[1]]}))
    first.log_table(source, table)
    first.finish(source)

    second = tracker.start_parent("p2", {}, {})
    assert log_cached_stage(second, sp, kind_of(sp.kind), {"accuracy/overall": 0.5}) == source
    child = second.client.search_runs([tracker.experiment_id],
                                      f"tags.mlflow.parentRunId = '{second.parent_run_id}'")[0]
    assert child.data.tags["source_run_id"] == source and child.data.tags["cache_hit"] == "true"
    assert [m.step for m in second.client.get_metric_history(child.info.run_id, "reward/total")] == [0, 1, 2]
    names = {a.path for a in second.client.list_artifacts(child.info.run_id)}
    assert {"report.md", "summary.json", "completions.json"} <= names
    assert child.data.metrics["accuracy/overall"] == 0.5
    # A cached run is never taken as the source of a later one.
    third = tracker.start_parent("p3", {}, {})
    assert log_cached_stage(third, sp, kind_of(sp.kind), {}) == source


def test_registered_reasoner_loads_as_a_transformers_model(tiny_lm_path: Path, tmp_path: Path) -> None:
    import filecmp

    import mlflow.transformers
    from mlflow.models import get_model_info

    from embodied_r.evaluation.registry import register_model_folder, resolve_model_uri

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    version = register_model_folder(tiny_lm_path, "reasoner", tracking_uri=store)
    mlflow.set_tracking_uri(store)
    mlflow.set_registry_uri(store)
    try:
        uri = f"models:/reasoner/{version.version}"
        info = get_model_info(uri)
        assert "transformers" in info.flavors
        assert info.flavors["transformers"]["task"] == "text-generation"
        assert info.signature is not None and info.signature.inputs.to_dict() == [{"type": "string", "required": True}]
        pipe = mlflow.transformers.load_model(uri)
        out = pipe("Frame 0: Observe:", max_new_tokens=4, do_sample=False)
        assert isinstance(out[0]["generated_text"], str) and out[0]["generated_text"].startswith("Frame 0")
    finally:
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
    # The backends still get the checkpoint folder itself for models:/ references.
    folder = Path(resolve_model_uri(uri, tracking_uri=store, cache_root=tmp_path / "cache"))
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in tiny_lm_path.iterdir())
    assert not filecmp.dircmp(tiny_lm_path, folder).diff_files


CHILD = r'''
import json, sys, time
from embodied_r.training.callbacks import STEP_MARK
from embodied_r.training.environment import PROGRESS_MARK
for step in (1, 2, 3):
    print(PROGRESS_MARK, step, 3, flush=True)
    print(STEP_MARK, json.dumps({"stage": "train_stage1", "step": step, "total": 3, "global": step,
                                 "reward": 0.5, "components": {"format": 1.0}, "kl": 0.0}), flush=True)
    time.sleep(0.2)
'''

PARENT = r'''
import sys
from pathlib import Path
from embodied_r import progress
from embodied_r.training.environment import _stream
assert sys.stderr.isatty()
with progress.listening(progress.TerminalBar()):
    progress.say(progress.stage_line("train_stage1", "started"))
    rc = _stream([sys.executable, "-c", sys.argv[1]], dict(__import__("os").environ), Path(sys.argv[2]),
                 "train_stage1")
    progress.say(progress.stage_line("train_stage1", "done", 1.0))
sys.exit(rc)
'''


def test_training_shows_a_bar_and_step_lines_on_a_terminal(tmp_path: Path) -> None:
    """Through a pseudo-terminal, as a user sees it: a progress bar that reaches 3/3 and one
    compact line per step, no raw dict."""
    import os
    import sys

    import pexpect

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "COLUMNS": "120"}
    child = pexpect.spawn(sys.executable, ["-c", PARENT, CHILD, str(tmp_path / "train.log")], env=env,
                          encoding="utf-8", timeout=120, dimensions=(40, 120))
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == 0, out
    assert "3/3" in out and ("step/s" in out or "s/step" in out), out  # tqdm's bar, drawn on the tty
    assert out.count("train_stage1  step ") == 3 and "reward 0.500  format 1.000" in out
    assert "[stage] train_stage1  started" in out and "{" not in out
    assert "[embodied-r step]" in (tmp_path / "train.log").read_text()  # the full record stays in the log
