"""The demo flow end to end under Prefect's test harness, tracked in a real MLflow store."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

STAGE_RUNS = {"download", "preprocess", "keyframes", "perception", "convert",
              "train_stage1", "train_stage2", "train_stage3", "evaluate"}


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

    first = embodied_r(recipe="demo")
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
    weights = {n: children[n].data.params["stage.consistency_weight"] for n in
               ("train_stage1", "train_stage2", "train_stage3")}
    assert [float(w) for w in weights.values()] == [0.0, 0.0, 0.2]
    from mlflow import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(
        children["train_stage1"].info.run_id, "rewards/format_reward/mean")
    assert len(history) >= 2
    assert any(k.startswith("accuracy/") for k in children["evaluate"].data.metrics)

    from embodied_r.evaluation.registry import version_of_folder

    model = first["stages"]["train_stage3"] + "/model"
    champion = MlflowClient(tracking_uri=uri).get_model_version_by_alias("embodied-r-reasoner", "champion")
    assert champion.version == version_of_folder("embodied-r-reasoner", model, uri).version
    assert parent.data.tags["promoted"] == "true"

    second = embodied_r(recipe="demo")
    assert set(second["cached"]) == STAGE_RUNS
    assert second["stages"] == first["stages"]
    parent2, children2 = _runs(uri, second["mlflow_run_id"])
    assert set(children2) == STAGE_RUNS
    assert all(c.data.tags.get("cache_hit") == "true" for c in children2.values())
    # The same trained model is not registered twice.
    assert len(MlflowClient(tracking_uri=uri).search_model_versions("name='embodied-r-reasoner'")) == 1
    assert "registered before" in second["promotion"]


def test_scheduled_reevaluation_scores_the_champion(harness):
    from mlflow import MlflowClient

    from flows.reevaluate import reevaluate

    result = reevaluate(model="models:/embodied-r-reasoner@champion", recipe="demo", split="test")
    uri = f"sqlite:///{harness / 'mlflow.db'}"
    run = MlflowClient(tracking_uri=uri).get_run(result["mlflow_run_id"])
    assert run.data.tags["stage"] == "reevaluate"
    assert run.data.tags["model_version"] == "models:/embodied-r-reasoner/1"
    assert "accuracy/overall" in run.data.metrics
    names = {a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run.info.run_id)}
    assert {"report.md", "accuracy_by_task.png", "summary.json"} <= names


def test_refresh_recomputes_a_stage_and_its_dependants_only(harness):
    from flows.pipeline import embodied_r

    result = embodied_r(recipe="demo", refresh=["train_stage3"])
    assert set(result["cached"]) == STAGE_RUNS - {"train_stage3", "evaluate"}
