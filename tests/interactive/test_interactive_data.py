"""Embodied-Reasoner data: the synthetic sample in the real layouts, the catalog (Parquet and
DuckDB), the image pairing check, a local mirror with its manifest, and the built-in house
replaying every real test case (skipped where ../shared is absent), and image zips that the
safe extraction refuses."""

from __future__ import annotations

import json
import shutil
import zipfile

import duckdb
import pytest

from embodied_r.errors import DataSourceError
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


def _zip_with(path, name: str, data: bytes, link: bool = False) -> None:
    info = zipfile.ZipInfo(name)
    if link:
        info.external_attr = 0o120777 << 16  # a symbolic link, its target as the member's bytes
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(info, data)


@pytest.mark.parametrize("name, data, link, refusal", [
    ("house/a.png", b"../../../../etc/passwd", True, "is a link"),
    ("../../escaped.png", b"png", False, "escapes the target folder"),
    ("/abs/escaped.png", b"png", False, "escapes the target folder"),
    ("house/huge.png", b"x" * 4096, False, "over the bound 1024"),
])
def test_image_zips_with_links_escapes_or_past_the_bound_are_refused(tmp_path, name, data, link, refusal):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _zip_with(mirror / "images.zip", name, data, link)
    config = {"data": {"source": "local", "source_dir": str(mirror), "max_zip_bytes": 1024}}
    with pytest.raises(DataSourceError, match=refusal) as err:
        run_data_stage(tmp_path / "stage", config, {})
    assert "images.zip" in str(err.value)
    assert not (tmp_path / "stage").exists()
    assert not list(tmp_path.rglob("*.png")) and not (tmp_path.parent / "escaped.png").exists()


def test_an_image_zip_within_the_bound_is_unpacked_under_data_images(data_stage, tmp_path):
    out, _ = data_stage
    mirror = tmp_path / "mirror"
    shutil.copytree(out / "raw", mirror)
    _zip_with(mirror / "images.zip", "house/a.png", b"x" * 1024)
    config = {"data": {"source": "local", "source_dir": str(mirror), "max_zip_bytes": 1024}}
    run_data_stage(tmp_path / "stage", config, {})
    assert (tmp_path / "stage" / "raw" / "data" / "images" / "house" / "a.png").read_bytes() == b"x" * 1024
    assert json.loads((tmp_path / "stage" / "manifest.json").read_text())["zips_unpacked"] == 1


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
