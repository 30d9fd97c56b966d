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
