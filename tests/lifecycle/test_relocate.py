"""A copied or moved home is refused until its recorded paths are rewritten, and the
rewrite points the catalog, the stage summaries and the MLflow store at the new place."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied_r.errors import HomeMovedError
from embodied_r.io import OUTPUTS_KEY, damaged_outputs, write_summary
from embodied_r.lifecycle.relocate import relocate_home
from embodied_r.paths import claim_home


def _used_home(root: Path) -> None:
    """A home as the pipeline leaves it: marker, a catalog with video paths, a summary, MLflow."""
    from embodied_r.tracking.runs import Tracker
    from embodied_r.tracking.store import tracking_uri

    claim_home(root)
    stage = root / "stages" / "preprocess" / "abc"
    stage.mkdir(parents=True)
    video = root / "sources" / "UrbanVideo-Bench" / "videos" / "v_1.mp4"
    pq.write_table(pa.table({"uid": ["u:1"], "video_path": [str(video)], "frames": [[str(video), "x"]]}),
                   stage / "catalog.parquet")
    # Written as a stage writes it: with the size of each file it holds (``io.OUTPUTS_KEY``).
    write_summary(stage, {"model": str(root / "stages" / "m"), "home": str(root), "note": f"{root}x stays"})
    Tracker.open("relocate-test", tracking_uri(None, root), root)


def test_a_moved_home_is_refused_then_relocated(tmp_path: Path):
    old, new = tmp_path / "home", tmp_path / "home-copy"
    _used_home(old)
    shutil.copytree(old, new)
    with pytest.raises(HomeMovedError, match=r"embodied-r relocate --home .*home-copy"):
        claim_home(new)
    claim_home(old)  # the original is untouched and still fine

    counts = relocate_home(new)
    assert counts["parquet"] == 1 and counts["text"] == 1 and counts["sqlite"] >= 1
    assert claim_home(new) == new
    row = pq.read_table(new / "stages" / "preprocess" / "abc" / "catalog.parquet").to_pylist()[0]
    assert row["video_path"] == str(new / "sources" / "UrbanVideo-Bench" / "videos" / "v_1.mp4")
    assert row["frames"] == [row["video_path"], "x"]
    summary = json.loads((new / "stages" / "preprocess" / "abc" / "summary.json").read_text())
    assert summary.pop(OUTPUTS_KEY) and summary == {"model": str(new / "stages" / "m"), "home": str(new),
                                                    "note": f"{old}x stays"}
    # The catalog's rewritten paths changed its size: the stage records it again, and stays done.
    assert damaged_outputs(new / "stages" / "preprocess" / "abc") == []

    from mlflow import MlflowClient

    from embodied_r.tracking.store import tracking_uri

    exp = MlflowClient(tracking_uri(None, new)).get_experiment_by_name("relocate-test")
    assert exp.artifact_location == (new / "mlartifacts").as_uri()
    # The original's store still points at the original.
    exp_old = MlflowClient(tracking_uri(None, old)).get_experiment_by_name("relocate-test")
    assert exp_old.artifact_location == (old / "mlartifacts").as_uri()
    assert relocate_home(new)["parquet"] == 0  # a second run finds nothing to change


def test_the_cli_says_how_to_relocate_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch):
    from embodied_r.apps.cli import main

    old, new = tmp_path / "h", tmp_path / "moved"
    # --home sets EMBODIED_R_HOME for the process: restore the session's home afterwards.
    monkeypatch.setenv("EMBODIED_R_HOME", str(new))
    claim_home(old)
    old.rename(new)
    assert main(["--home", str(new), "plan", "--recipe", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"embodied-r relocate --home {new}" in err
    # The command the message gives is the one that works.
    monkeypatch.delenv("EMBODIED_R_HOME")
    assert main(err.split("Run `embodied-r ", 1)[1].split("`", 1)[0].split()) == 0
    assert main(["--home", str(new), "plan", "--recipe", "smoke"]) == 0
