"""The catalog over the real UrbanVideo-Bench questions, its counts in MLflow and on the console.

The real ``MCQ.parquet`` (5,355 questions) is laid out in a mirror with a one-byte stand-in for
each of its 1,393 videos; the catalog checks that a video exists, never reads it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from conftest import SHARED
from tests.stage_inputs import download_raw
from embodied_r.benchmarks import urbanvideo
from embodied_r.data.catalog import metric_name, run_catalog
from embodied_r.apps.cli_data import main as cli_main
from embodied_r.data.config import CatalogConfig
from embodied_r.tracking.names import numeric_metrics
from embodied_r.tracking.runs import Tracker

REAL_MCQ = (SHARED or Path("/nonexistent")) / "benchmarks" / "urbanvideo-bench" / "MCQ.parquet"
pytestmark = pytest.mark.skipif(not REAL_MCQ.is_file(), reason=f"real MCQ.parquet not found at {REAL_MCQ}")


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    mirror = tmp_path_factory.mktemp("mirror")
    uv = mirror / urbanvideo.BENCHMARK.folder
    (uv / "videos").mkdir(parents=True)
    (uv / urbanvideo.FILE).write_bytes(REAL_MCQ.read_bytes())
    for vid in set(pq.read_table(REAL_MCQ, columns=["video_id"]).column("video_id").to_pylist()):
        (uv / "videos" / vid).write_bytes(b"v")
    return download_raw(mirror, tmp_path_factory, ["urbanvideo"], sources=mirror)


def test_every_task_is_catalogued_and_its_counts_are_valid_mlflow_metrics(raw, tmp_path):
    source = Counter(pq.read_table(REAL_MCQ, columns=["question_category"]).column(0).to_pylist())
    summary = run_catalog(raw, tmp_path / "all", CatalogConfig(tasks="all"))
    assert summary["questions"] == 5355 and summary["failed"] == 0 and summary["videos"] == 1393
    counts = summary["counts"]["urbanvideo"]
    assert len(counts) == 16
    assert sum(counts["start_end_position"].values()) == source["Start/End Position"] == 146
    assert sum(counts["high_level_planning"].values()) == source["High-level Planning"] == 261
    assert {k: sum(v.values()) for k, v in counts.items()} == {metric_name(k): n for k, n in source.items()}
    paper = run_catalog(raw, tmp_path / "paper", CatalogConfig())
    assert {k: sum(v.values()) for k, v in paper["counts"]["urbanvideo"].items()} == {
        "action_generation": 1183, "landmark_position": 876, "progress_evaluation": 781, "counterfactual": 134}

    # The flow logs a stage summary's numbers flattened with '/': a real MLflow store must take them.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker.open("catalog-test", uri, tmp_path).start_parent("preprocess", {}, {})
    metrics = numeric_metrics(summary)
    tracker.log_metrics(tracker.parent_run_id, metrics)
    logged = MlflowClient(tracking_uri=uri).get_run(tracker.parent_run_id).data.metrics
    assert logged["counts/urbanvideo/start_end_position/test"] == counts["start_end_position"]["test"]
    assert logged["counts/urbanvideo/high_level_planning/train"] == counts["high_level_planning"]["train"]
    assert logged["splits/urbanvideo/train"] == summary["n_train"]
    assert len([k for k in logged if k.startswith("counts/")]) == 16 * 3


def test_catalog_command_prints_counts_per_benchmark_task_and_split(raw, tmp_path, capsys):
    out = tmp_path / "cat"
    assert cli_main(["catalog", "--raw", str(raw), "--tasks", "all", "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    table = {}
    for line in printed.splitlines():
        parts = line.split()
        if parts and parts[0] == "urbanvideo":  # benchmark, task, train, val, test, total
            table[" ".join(parts[1:-4])] = [int(x) for x in parts[-4:]]
    assert len(table) == 16 + 1
    assert table["Start/End Position"][-1] == 146 and table["(all tasks)"][-1] == 5355
    rows = pq.read_table(out / "catalog.parquet").to_pylist()
    for task in ("Start/End Position", "High-level Planning", "(all tasks)"):
        mine = [r for r in rows if task == "(all tasks)" or r["category"] == task]
        assert table[task][:3] == [sum(r["split"] == s for r in mine) for s in ("train", "val", "test")]
    # The same --out again is refused unless asked to rebuild.
    assert cli_main(["catalog", "--raw", str(raw), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert cli_main(["catalog", "--raw", str(raw), "--out", str(out), "--force"]) == 0
    assert len(pq.read_table(out / "catalog.parquet")) == 1183 + 876 + 781 + 134
