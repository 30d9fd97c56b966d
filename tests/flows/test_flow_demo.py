"""The demo flow end to end under Prefect's test harness, tracked in a real MLflow store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STAGE_RUNS = {"download", "preprocess", "keyframes", "perception", "convert",
              "train_stage1", "train_stage2", "train_stage3", "evaluate", "promote"}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("demo-home")
    with pytest.MonkeyPatch.context() as mp:  # restored however the module ends
        mp.setenv("EMBODIED_R_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        with prefect_test_harness(server_startup_timeout=120):
            yield home


def _runs(uri: str, parent_id: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_id)
    children = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'"
    )
    return parent, {c.data.tags["stage"]: c for c in children}


def test_demo_runs_then_is_served_from_cache(harness):
    from flows.pipeline import embodied_r

    first = embodied_r(recipe="smoke")
    assert first["cached"] == []
    assert set(first["stages"]) == STAGE_RUNS
    uri = first["tracking_uri"]
    assert uri == f"sqlite:///{harness / 'mlflow.db'}"

    parent, children = _runs(uri, first["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["prefect.flow_run_id"]
    assert set(children) == STAGE_RUNS
    for name, run in children.items():
        assert run.info.status == "FINISHED", name
        assert run.data.params, f"{name} logged no params"
        assert run.data.metrics, f"{name} logged no metrics"
    # Training stages carry their reward weights and per-step reward means.
    weights = {n: children[n].data.params["stage.rewards.consistency"] for n in
               ("train_stage1", "train_stage2", "train_stage3")}
    assert [float(w) for w in weights.values()] == [0.0, 0.0, 0.2]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(children["train_stage1"].info.run_id, "reward/format")
    assert len(history) >= 2
    # One global step across the stages: stage 2 goes on where stage 1 stopped.
    steps = {n: sorted(m.step for m in client.get_metric_history(children[n].info.run_id, "reward/total"))
             for n in ("train_stage1", "train_stage2")}
    assert steps["train_stage2"][0] == steps["train_stage1"][-1] + 1
    assert float(children["train_stage1"].data.params["summary.epochs_reached"]) < 1
    assert {c.info.run_name for c in children.values()} == STAGE_RUNS
    assert parent.info.run_name.startswith("fresh smoke ")
    assert any(k.startswith("accuracy/") for k in children["evaluate"].data.metrics)

    from embodied_r.evaluation.registry import version_of_folder

    model = first["stages"]["train_stage3"] + "/model"
    version = version_of_folder("embodied-r-reasoner", model, uri)
    assert version is not None and version.run_id == first["mlflow_run_id"]
    # The smoke recipe's random reasoner writes no answers in the format: below chance on the
    # validation split, it is registered but never made champion, and the run says why.
    assert parent.data.tags["promoted"] == "false"
    assert "not promoted to @champion" in first["promotion"] and "is not above chance" in first["promotion"]
    assert "chance" in version.description and "test split" in version.description

    second = embodied_r(recipe="smoke")
    assert set(second["cached"]) == STAGE_RUNS
    assert second["stages"] == first["stages"]
    parent2, children2 = _runs(uri, second["mlflow_run_id"])
    assert set(children2) == STAGE_RUNS
    assert all(c.data.tags.get("cache_hit") == "true" for c in children2.values())
    assert parent2.info.run_name.startswith("cached smoke ")
    assert "run of recipe `smoke`" in parent2.data.tags["mlflow.note.content"]
    # A cached child links to the run that computed it, and carries its history and files.
    source = children2["train_stage1"].data.tags["source_run_id"]
    assert source == children["train_stage1"].info.run_id
    assert len(client.get_metric_history(children2["train_stage1"].info.run_id, "reward/format")) == len(history)
    names = {a.path for a in client.list_artifacts(children2["evaluate"].info.run_id)}
    assert {"report.md", "predictions_table.json"} <= names
    # The same trained model is not registered twice.
    assert len(MlflowClient(tracking_uri=uri).search_model_versions("name='embodied-r-reasoner'")) == 1
    assert "registered before" in second["promotion"]


def test_scheduled_reevaluation_scores_the_champion(harness):
    from mlflow import MlflowClient

    from embodied_r.evaluation.registry import set_alias
    from flows.reevaluate import reevaluate

    # The smoke run's model is below chance and never promoted: before a champion exists the
    # nightly ends Skipped with one line naming the command that promotes one.
    skipped = reevaluate(recipe="smoke", return_state=True)
    assert skipped.is_completed() and skipped.name == "Skipped"
    assert "no @champion yet" in skipped.message and "`embodied-r promote --recipe smoke`" in skipped.message
    assert "\n" not in skipped.message
    # Point the alias at it by hand; the default model is the recipe's registered model's champion.
    set_alias("embodied-r-reasoner", "champion", "1", f"sqlite:///{harness / 'mlflow.db'}")
    result = reevaluate(recipe="smoke", split="test")
    uri = f"sqlite:///{harness / 'mlflow.db'}"
    run = MlflowClient(tracking_uri=uri).get_run(result["mlflow_run_id"])
    assert run.data.tags["stage"] == "reevaluate"
    assert run.data.tags["model_version"] == "models:/embodied-r-reasoner/1"
    assert "accuracy/overall" in run.data.metrics
    names = {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run.info.run_id)}
    assert {"report.md", "accuracy_by_task.png", "summary.json"} <= names


def test_refresh_recomputes_a_stage_and_its_dependants_only(harness):
    from flows.pipeline import embodied_r

    result = embodied_r(recipe="smoke", refresh=["train_stage3"])
    assert set(result["cached"]) == STAGE_RUNS - {"train_stage3", "evaluate", "promote"}


def test_mlflow_ui_shows_runs_metrics_and_the_report(harness, tmp_path):
    """The MLflow UI over the demo store, in headless Chromium: the experiment opens on the run
    list with the parent runs, the printed run-list link shows the trained accuracy as a column,
    a parent shows `accuracy/overall`, a training run's charts open on its rewards, and a cached
    run's evaluate child lists and shows `report.md`. Screenshots go to $EMBODIED_R_SCREENSHOTS
    when set."""
    from tests.browser import ensure_chromium

    binary, why = ensure_chromium()
    if binary is None:
        pytest.skip(why)
    check_mlflow_ui(binary, harness, tmp_path)


def check_mlflow_ui(binary, harness, tmp_path):
    import sys
    from pathlib import Path

    from mlflow import MlflowClient

    import re

    from tests.browser import GENAI_ONLY, Browser
    from tests.servers import background, free_port

    from embodied_r.tracking.names import runs_url

    uri = f"sqlite:///{harness / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("embodied-r")
    parents = [r for r in client.search_runs([experiment.experiment_id]) if "mlflow.parentRunId" not in r.data.tags
               and r.data.tags.get("stage") is None]
    cached_parent = next(r for r in parents if r.data.tags.get("cache_status") == "cached")
    evaluate = client.search_runs([experiment.experiment_id], filter_string=(
        f"tags.mlflow.parentRunId = '{cached_parent.info.run_id}' and tags.stage = 'evaluate'"))[0]
    assert evaluate.data.tags["source_run_id"]

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    shots = Path(os.environ.get("EMBODIED_R_SCREENSHOTS") or tmp_path)
    env = dict(os.environ)
    with background([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", uri,
                     "--host", "127.0.0.1", "--port", str(port)], tmp_path / "mlflow-ui.log", env,
                    ready_url=f"{base}/health", timeout=180):
        browser = Browser(binary)
        try:
            # The experiment page (as the CLI's links open it) lands on the run list.
            browser.open(f"{base}/#/experiments/{experiment.experiment_id}?workflowType=machine_learning")
            text = browser.wait_for(cached_parent.info.run_name, "matching runs")
            assert all(p.info.run_name in text for p in parents[:3])
            assert not [t for t in GENAI_ONLY if t in text], text[:2000]  # not the GenAI page
            browser.screenshot(shots / "mlflow-run-list.png")
            # A parent run carries the headline metric and its description.
            browser.open(f"{base}/#/experiments/{experiment.experiment_id}/runs/{cached_parent.info.run_id}?workflowType=machine_learning")
            browser.wait_for("accuracy/overall", "run of recipe")
            browser.screenshot(shots / "mlflow-parent-run.png")
            # The printed link to all runs opens the saved view: the trained accuracy (in percent,
            # rounded) is a column of the run list, each parent's value in it.
            browser.open(runs_url(base, experiment.experiment_id))
            column = browser.wait_for_texts('[col-id="metrics.`test/trained`"]', 1 + len(parents))
            assert column[0] == "test/trained", column
            shown = [float(v) for v in column[1:] if v not in ("", "-")]
            for parent in parents:
                value = parent.data.metrics["test/trained"]
                assert value == round(100 * parent.data.metrics["accuracy/overall"], 1)
                assert any(abs(v - value) < 0.01 for v in shown), (parent.info.run_name, value, column)
            browser.screenshot(shots / "mlflow-run-list-accuracy.png")
            # A training run's chart page opens on the rewards: the groups are listed by name.
            train = client.search_runs([experiment.experiment_id], filter_string=(
                f"tags.mlflow.parentRunId = '{cached_parent.info.run_id}' and tags.stage = 'train_stage1'"))[0]
            browser.open(f"{base}/#/experiments/{experiment.experiment_id}/runs/{train.info.run_id}/model-metrics?workflowType=machine_learning")
            lines = browser.wait_for("reward/total", "timing").splitlines()
            groups = [name for name, count in zip(lines, lines[1:]) if re.fullmatch(r"\(\d+\)", count)]
            assert groups[0] == "reward" and {"timing", "train"} <= set(groups) and "summary" not in groups, groups
            browser.screenshot(shots / "mlflow-train-charts.png")
            # The cached run's evaluate child lists the report among its artifacts, and shows it.
            browser.open(f"{base}/#/experiments/{experiment.experiment_id}/runs/{evaluate.info.run_id}/artifacts?workflowType=machine_learning")
            browser.wait_for("report.md", "predictions_table.json")
            browser.screenshot(shots / "mlflow-evaluate-artifacts.png")
            browser.click_text("report.md")
            browser.wait_for("Accuracy per task", "Beside the paper")
            browser.screenshot(shots / "mlflow-evaluate-report.png")
        finally:
            browser.close()


def test_a_copied_and_relocated_home_plans_every_stage_done(harness, tmp_path):
    """No key holds the home's path: a finished home moved elsewhere and relocated, as the
    project's own error message advises, keeps every stage it finished."""
    import shutil

    from embodied_r.config import load_recipe
    from embodied_r.lifecycle.relocate import relocate_home
    from embodied_r.pipeline import plan

    before = plan(load_recipe("smoke"), harness)
    assert all(sp.complete for sp in before.values())
    moved = tmp_path / "moved-home"
    shutil.copytree(harness, moved)
    relocate_home(moved)
    after = plan(load_recipe("smoke"), moved)
    assert [n for n, sp in after.items() if not sp.complete] == []
    assert {n: sp.key for n, sp in after.items()} == {n: sp.key for n, sp in before.items()}


def run_audit(out, config, inputs, mlflow_run_id):
    """A stage declared by this test alone: it counts the records of each split convert wrote."""
    from pathlib import Path

    import pyarrow.parquet as pq

    from embodied_r.io import stage_folder, write_summary

    counts = {p.stem: pq.read_metadata(p).num_rows for p in sorted(Path(inputs["records"]).glob("*.parquet"))}
    summary = {"done": sum(counts.values()), "failed": 0, **{f"records/{k}": v for k, v in counts.items()}}
    with stage_folder(Path(out)) as work:
        write_summary(work, summary)
    return summary


def test_a_stage_declared_once_is_planned_keyed_run_listed_and_deployed(harness, monkeypatch, capsys, request):
    """Adding a stage is its declaration and its line in the list, and nothing else: a stage
    declared here, between convert and warmstart, reading convert's records."""
    import yaml

    from embodied_r import stage_kinds
    from embodied_r.apps.cli import build_parser, main
    from embodied_r.config import load_recipe
    from embodied_r.pipeline import plan
    from embodied_r.stage_plan import StageKind
    from flows import deployments, stages

    audit = StageKind("audit", f"{__name__}:run_audit", "cpu", "count the GRPO records of each split",
                      inputs={"records": "convert"})
    at = [k.name for k in stage_kinds.KINDS].index("convert") + 1
    monkeypatch.setattr(stage_kinds, "KINDS", [*stage_kinds.KINDS[:at], audit, *stage_kinds.KINDS[at:]])
    from tasks.stages import STAGE_TASKS

    # The task and flow the declaration makes on first use leave with it, for the tests after.
    request.addfinalizer(lambda: [made.pop("audit", None) for made in (STAGE_TASKS, stages.STAGE_FLOWS)])

    # Listed by the CLI, with a deployment and a flow of its own.
    assert "count the GRPO records of each split" in build_parser().format_help()
    deployed = {d["name"]: d for d in yaml.safe_load(deployments.render())["deployments"]}
    assert deployed["audit"]["entrypoint"] == "flows/stages.py:audit_flow"
    assert deployed["audit"]["work_pool"]["name"] == "cpu"
    assert stages.audit_flow.name == "embodied-r-audit"

    # Run by `embodied-r run` on the finished smoke home: it alone runs, the rest is served.
    capsys.readouterr()
    assert main(["run", "--recipe", "smoke"]) == 0
    said = capsys.readouterr().out
    smoke = plan(load_recipe("smoke"), harness)
    assert smoke["audit"].complete
    assert json.loads((Path(smoke["audit"].out) / "summary.json").read_text())["records/train"] > 0
    served = said.split("Served from cache: ", 1)[1].splitlines()[0].split(", ")
    assert "audit" not in served and set(served) == set(smoke) - {"audit"}
    assert main(["plan", "--recipe", "smoke"]) == 0
    assert f"audit          done     {smoke['audit'].out}" in capsys.readouterr().out
