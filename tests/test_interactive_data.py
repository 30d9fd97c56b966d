"""Embodied-Reasoner data: the synthetic sample in the real layouts, the catalog (Parquet and
DuckDB), the image pairing check, a local mirror with its manifest, and the built-in house
replaying every real test case (skipped where ../shared is absent)."""

from __future__ import annotations

import json
import shutil

import duckdb
import pytest

from embodied_r.interactive import tasks
from embodied_r.interactive.catalog import build, read_test_cases, read_trajectories
from embodied_r.interactive.download import run_data_stage
from embodied_r.interactive.household import HouseholdEnvironment
from embodied_r.interactive.prompts import FEEDBACK


@pytest.fixture(scope="module")
def data_stage(tmp_path_factory):
    out = tmp_path_factory.mktemp("stage") / "data"
    summary = run_data_stage(out, {"data": {"source": "synthetic", "synthetic_train": 9, "synthetic_test": 11}}, {})
    return out, summary


def test_synthetic_sample_is_cataloged_with_stages_and_pairs(data_stage):
    out, summary = data_stage
    assert summary["trajectories"] == 9 and summary["unpaired"] == 0
    assert summary["stages"] == {"stage1": 3, "stage2": 3, "stage3": 3}
    assert summary["test_cases"] == 11 and len(summary["test_groups"]) == 4
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"] == "synthetic" and "sha256" in manifest["files"]["train_multiturn.json"]
    with duckdb.connect(str(out / "catalog.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM turns WHERE feedback").fetchone()[0] == 3
        assert con.execute("SELECT count(DISTINCT task_type) FROM test_cases").fetchone()[0] == 11
    stage3 = read_trajectories(out, 3)
    assert all(any(FEEDBACK in m["content"] for m in t["messages"]) for t in stage3)
    assert all(p.endswith(".png") and __import__("os").path.isfile(p) for t in stage3 for p in t["images"])
    assert {c["tasktype"] for c in read_test_cases(out)} == set(tasks.TASK_TYPES)


def test_unpaired_images_are_found_and_left_out(data_stage, tmp_path):
    out, _ = data_stage
    mirror = tmp_path / "mirror"
    shutil.copytree(out / "raw", mirror)
    records = json.loads((mirror / "train_multiturn.json").read_text())
    (mirror / records[0]["images"][0]).unlink()
    records[1]["images"] = records[1]["images"][:-1]
    (mirror / "train_multiturn.json").write_text(json.dumps(records))
    summary = build(mirror, tmp_path / "cat")
    assert summary["unpaired"] == 2 and summary["trajectories"] == 7
    local = run_data_stage(tmp_path / "local", {"data": {"source": "local", "source_dir": str(mirror)}}, {})
    assert local["unpaired"] == 2
    assert json.loads((tmp_path / "local" / "manifest.json").read_text())["source"] == "local"


REAL = tasks.shared_test_file()


@pytest.mark.skipif(REAL is None, reason="../shared/benchmarks/embodied-reasoner/test_809.json is not beside "
                                         "this checkout")
def test_every_real_test_case_is_solvable_by_its_key_actions_in_the_built_in_house(tmp_path):
    env = HouseholdEnvironment(width=32, height=18)
    for case in tasks.load_test_cases(REAL):
        env.reset(case, tmp_path)
        for k in tasks.key_actions(case)[:-1]:
            verb = next(v for v in ("navigate to", "put in", "pickup", "put", "toggle", "open", "close") if
                        k.startswith(v))
            result = env.step(verb, k[len(verb):].strip() or None)
            assert result.success, (case["identity"], k, result.feedback)
