"""The stage folder is the one record of "done": Prefect keeps no cache of its own, so losing
Prefect's files between two runs changes nothing a user sees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from embodied_r.paths import prefect_results


def _download_runs(home: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("embodied-r")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.stage = 'download'")
    return sorted(runs, key=lambda r: r.info.start_time)


@pytest.mark.slow
def test_a_lost_prefect_results_folder_still_reads_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.testing.utilities import prefect_test_harness

    from flows.stages import STAGE_FLOWS

    home = tmp_path / "home"
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with prefect_test_harness(server_startup_timeout=120):
        first = STAGE_FLOWS["download"](recipe="smoke", home=str(home))
        second = STAGE_FLOWS["download"](recipe="smoke", home=str(home))  # Prefect's files, if any, in place
        shutil.rmtree(prefect_results(home), ignore_errors=True)
        third = STAGE_FLOWS["download"](recipe="smoke", home=str(home))
    assert (first["cached"], second["cached"], third["cached"]) == ([], ["download"], ["download"])
    runs = _download_runs(home)
    assert [r.data.tags.get("cache_hit") for r in runs] == [None, "true", "true"]
    assert len({r.data.tags["output"] for r in runs}) == 1
    # Each cached child points at the run that computed the folder.
    assert {r.data.tags["source_run_id"] for r in runs[1:]} == {runs[0].info.run_id}
    assert not prefect_results(home).exists()


def test_a_stage_headline_follows_its_kind_not_its_summary_keys() -> None:
    from tasks.stages import _headline, short_summary

    summary = {"done": 9, "failed": 1, "steps": 4, "stopped_by": "epochs", "epochs_reached": 1.0,
               "accuracy/overall": 0.5, "count/overall": 10}
    assert _headline("convert", summary) == "9 done, 1 failed"
    assert _headline("train", summary) == "4 steps, epoch 1.00, stopped by epochs"
    assert _headline("evaluate", summary).startswith("accuracy 50.0")
    # A kind's own figures lead its Prefect summary.
    assert list(short_summary("train", summary))[:3] == ["steps", "epochs_reached", "stopped_by"]
    assert list(short_summary("evaluate", summary))[:2] == ["accuracy/overall", "count/overall"]
