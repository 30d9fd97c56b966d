"""Download from a local mirror, safe zip extraction, and the catalog with its splits."""

import json
import os
import stat
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied_r import schemas
from embodied_r.benchmarks import urbanvideo, vsibench
from embodied_r.benchmarks.base import arrow_schema
from embodied_r.data.catalog import assign_splits, run_catalog
from embodied_r.data.config import CatalogConfig, DownloadConfig, SplitConfig
from embodied_r.data.download import run_download
from embodied_r.errors import CatalogError, DataSourceError
from embodied_r.io import safe_extract, sha256_file
from embodied_r.synthetic.config import SyntheticConfig


def _mirror(root: Path) -> Path:
    """A local mirror laid out like the two hub repos, with tiny stand-in video files."""
    uv = root / urbanvideo.BENCHMARK.folder
    (uv / "videos").mkdir(parents=True)
    rows = []
    qid = 0
    for scene in range(6):
        for clip in range(2):
            vid = f"EmbodiedCity_{scene}_{clip}.mp4"
            (uv / "videos" / vid).write_bytes(b"not really a video")
            for cat in ("Landmark Position", "Action Generation", "Object Recall"):
                rows.append({"Question_id": qid, "video_id": vid, "question_category": cat,
                             "question": "Question: Where?\nChoices:\nA. Left.\nB. Right.",
                             "answer": "B"})
                qid += 1
    rows.append({"Question_id": qid, "video_id": "EmbodiedCity_99.mp4", "question_category":
                 "Counterfactual", "question": "Question: If?\nChoices:\nA. Yes.\nB. No.", "answer": "A"})
    rows.append({"Question_id": qid + 1, "video_id": "EmbodiedCity_0_0.mp4", "question_category":
                 "Counterfactual", "question": "Question: If?\nChoices:\nA. Yes.\nB. No.", "answer": "Z"})
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(urbanvideo.COLUMNS)), uv / urbanvideo.FILE)

    vsi = root / vsibench.BENCHMARK.folder
    vsi.mkdir()
    vrows = []
    with zipfile.ZipFile(vsi / "scannet.zip", "w") as zf:
        for i in range(4):
            zf.writestr(f"scannet/scene{i:04d}_00.mp4", b"video bytes")
            vrows.append({"id": 2 * i, "dataset": "scannet", "scene_name": f"scene{i:04d}_00",
                          "question_type": "object_rel_direction_hard", "question": "Which side?",
                          "options": ["A. left", "B. right"], "ground_truth": "A"})
            vrows.append({"id": 2 * i + 1, "dataset": "scannet", "scene_name": f"scene{i:04d}_00",
                          "question_type": "object_counting", "question": "How many chairs?",
                          "options": None, "ground_truth": "3"})
    pq.write_table(pa.Table.from_pylist(vrows, schema=arrow_schema(vsibench.COLUMNS)), vsi / vsibench.FILE)
    return root


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _state(root: Path) -> dict:
    """Content, size, mode and modification time of every file under ``root``."""
    return {p: (sha256_file(p), p.stat().st_size, p.stat().st_mode, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_local_download_and_catalog(tmp_path):
    src = _mirror(tmp_path / "mirror")
    # What a real mirror also holds: repo files the pipeline does not need, and the commit
    # note `hf download --local-dir` leaves beside each file.
    (src / urbanvideo.BENCHMARK.folder / "README.md").write_text("card")
    (src / vsibench.BENCHMARK.folder / ".gitattributes").write_text("*.zip filter=lfs")
    (src / vsibench.BENCHMARK.folder / "test_debiased-00000-of-00001.parquet").write_bytes(b"other")
    note = src / urbanvideo.BENCHMARK.folder / ".cache" / "huggingface" / "download" / "MCQ.parquet.metadata"
    note.parent.mkdir(parents=True)
    note.write_text(f"{COMMIT}\netag\n1700000000.0\n")
    before = _state(src)
    cfg = DownloadConfig(source="local", source_dir=str(src))
    summary = run_download(tmp_path / "raw", cfg, tmp_path / "sources")
    assert summary["videos"] == 12 + 4
    raw = tmp_path / "raw"
    assert (raw / vsibench.BENCHMARK.folder / "videos" / "scannet" / "scene0001_00.mp4").is_file()
    brought = {p.relative_to(raw).as_posix() for p in raw.rglob("*") if p.is_file()}
    assert not {n for n in brought if n.endswith(("README.md", ".gitattributes", "debiased-00000-of-00001.parquet"))}
    manifest = json.loads((raw / "manifest.json").read_text())
    assert manifest["benchmarks"]["urbanvideo"]["repo"] == "EmbodiedCity/UrbanVideo-Bench"
    assert manifest["benchmarks"]["urbanvideo"]["revision"] == COMMIT
    assert manifest["benchmarks"]["vsibench"]["repo"] == "nyu-visionx/VSI-Bench"
    assert manifest["benchmarks"]["vsibench"]["revision"] is None  # that mirror carries no commit note
    extracted = {n for n in brought if n.startswith(f"{vsibench.BENCHMARK.folder}/videos/")}
    assert set(manifest["files"]) == brought - extracted - {"manifest.json", "summary.json"}
    for name, entry in manifest["files"].items():
        assert entry == {"size": (src / name).stat().st_size, "sha256": sha256_file(src / name)}
    assert summary["files"] == len(manifest["files"]) == 12 + 1 + 1 + 1  # videos, MCQ, VSI parquet, one zip
    assert run_download(tmp_path / "raw", cfg, tmp_path / "sources") == summary  # finished work reused

    out = tmp_path / "catalog"
    cat = run_catalog(tmp_path / "raw", out, CatalogConfig())
    rows = pq.read_table(out / "catalog.parquet").to_pylist()
    assert pq.read_schema(out / "catalog.parquet").remove_metadata() == schemas.CATALOG
    cats = {r["category"] for r in rows}
    assert "Object Recall" not in cats and "object_counting" not in cats  # paper subset only
    assert "object_rel_direction" in cats
    # One row's video is missing and one row's answer is not an option: both counted, not kept.
    assert cat["failed"] == 2 and cat["failure_reasons"] == {"video_missing": 1, "answer_not_an_option": 1}
    reasons = {r["item"]: r["reason"] for r in pq.read_table(out / "failures.parquet").to_pylist()}
    assert reasons["urbanvideo:36"].startswith("video_missing: EmbodiedCity_99.mp4")
    assert reasons["urbanvideo:37"].startswith("answer_not_an_option: answer 'Z'")
    # Scene-disjoint.
    split_of_scene = {}
    for r in rows:
        assert split_of_scene.setdefault((r["benchmark"], r["scene"]), r["split"]) == r["split"]
    assert {r["split"] for r in rows} >= {"train", "test"}

    every = run_catalog(tmp_path / "raw", tmp_path / "catalog-all", CatalogConfig(tasks="all"))
    assert every["questions"] > cat["questions"]
    numeric = [r for r in pq.read_table(tmp_path / "catalog-all" / "catalog.parquet").to_pylist()
               if r["answer_type"] == "number"]
    assert numeric and all(r["options"] == [] and r["answer"] == "3" for r in numeric)

    import duckdb

    with duckdb.connect(str(out / "catalog.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM questions").fetchone()[0] == len(rows)
    assert _state(src) == before  # download, extraction and catalog left the source as it was

    # Tasks by name, as the source writes them or in their metric form; unknown names are refused.
    named = run_catalog(raw, tmp_path / "named", CatalogConfig(tasks=["Landmark Position", "object_counting"]))
    assert set(named["counts"]["urbanvideo"]) == {"landmark_position"}
    assert set(named["counts"]["vsibench"]) == {"object_counting"}
    with pytest.raises(CatalogError, match=r"unknown task\(s\) 'Landmark'.*Landmark Position"):
        run_catalog(raw, tmp_path / "bad", CatalogConfig(tasks=["Landmark"]))


def test_synthetic_source_is_left_as_it_was(tmp_path):
    cfg = DownloadConfig(source="synthetic", synthetic=SyntheticConfig(
        urban_videos=2, clips_per_scene=2, vsi_scenes=1, seconds=3.0, width=160, height=90, fps=10.0))
    summary = run_download(tmp_path / "raw", cfg, tmp_path / "sources")
    (source,) = (tmp_path / "sources").iterdir()
    before = _state(source)
    run_catalog(tmp_path / "raw", tmp_path / "catalog", CatalogConfig(tasks="all"))
    assert summary["videos"] == 2 + 1 and _state(source) == before
    # A second stage folder from the same generated source: the source is reused, not rewritten.
    assert run_download(tmp_path / "raw2", cfg, tmp_path / "sources")["files"] == summary["files"]
    assert _state(source) == before
    manifest = json.loads((tmp_path / "raw" / "manifest.json").read_text())
    assert {b["repo"] for b in manifest["benchmarks"].values()} == {"EmbodiedCity/UrbanVideo-Bench",
                                                                    "nyu-visionx/VSI-Bench"}


def test_an_edited_generator_makes_a_new_synthetic_source(tmp_path, monkeypatch):
    """The synthetic source is keyed by the generator's code as well as its config: a source
    left by an earlier generator (other questions, other answers) is not linked again."""
    import embodied_r.data.download as download

    cfg = DownloadConfig(source="synthetic", synthetic=SyntheticConfig(
        urban_videos=2, clips_per_scene=2, vsi_scenes=0, seconds=3.0, width=160, height=90, fps=10.0))
    run_download(tmp_path / "raw", cfg, tmp_path / "sources")
    monkeypatch.setattr(download, "generator_version", lambda: "the generator after an edit")
    run_download(tmp_path / "raw2", cfg, tmp_path / "sources")
    assert len(list((tmp_path / "sources").iterdir())) == 2


def test_splits_are_seeded_and_stable():
    rows = [{"benchmark": "b", "scene": f"s{i}", "uid": str(i)} for i in range(40)]
    a = [dict(r) for r in rows]
    b = [dict(r) for r in rows]
    assign_splits(a, SplitConfig(seed=3))
    assign_splits(b, SplitConfig(seed=3))
    assert [r["split"] for r in a] == [r["split"] for r in b]
    c = [dict(r) for r in rows]
    assign_splits(c, SplitConfig(seed=4))
    assert [r["split"] for r in a] != [r["split"] for r in c]
    counts = {s: sum(r["split"] == s for r in a) for s in ("train", "val", "test")}
    assert counts == {"train": 30, "val": 2, "test": 8}
    assert {r["fold"] for r in a} == set(range(5))


def test_missing_column_names_column_and_file(tmp_path):
    uv = tmp_path / "raw" / urbanvideo.BENCHMARK.folder
    uv.mkdir(parents=True)
    pq.write_table(pa.table({"Question_id": [1], "video_id": ["x.mp4"]}), uv / urbanvideo.FILE)
    with pytest.raises(CatalogError, match=r"MCQ.parquet: missing column\(s\) question_category"):
        run_catalog(tmp_path / "raw", tmp_path / "out", CatalogConfig())


def test_local_source_must_exist(tmp_path):
    with pytest.raises(DataSourceError, match="source_dir"):
        run_download(tmp_path / "raw", DownloadConfig(source="local"), tmp_path)
    with pytest.raises(DataSourceError, match="laid out like the hub repos"):
        run_download(tmp_path / "raw", DownloadConfig(source="local", source_dir=str(tmp_path)), tmp_path)


@pytest.mark.parametrize("name", ["/abs/evil.mp4", "../evil.mp4", "a/../../evil.mp4"])
def test_extraction_refuses_escaping_entries(tmp_path, name):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(name, b"x")
    with pytest.raises(DataSourceError, match="escapes"):
        safe_extract(archive, tmp_path / "dest", 10**6)


def test_extraction_refuses_links_and_bombs_and_is_idempotent(tmp_path):
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("scannet/link.mp4")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(DataSourceError, match="link"):
        safe_extract(archive, tmp_path / "dest", 10**6)

    big = tmp_path / "big.zip"
    with zipfile.ZipFile(big, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("scannet/a.mp4", b"\0" * 100_000)
    with pytest.raises(DataSourceError, match="over the bound"):
        safe_extract(big, tmp_path / "dest", 50_000)
    assert safe_extract(big, tmp_path / "dest", 10**6) == 1
    mtime = os.stat(tmp_path / "dest" / "scannet" / "a.mp4").st_mtime_ns
    assert safe_extract(big, tmp_path / "dest", 10**6) == 0
    assert os.stat(tmp_path / "dest" / "scannet" / "a.mp4").st_mtime_ns == mtime


def test_fetch_and_catalog_commands_fill_the_pipelines_own_stage_folders(tmp_path, capsys):
    from embodied_r.apps.cli_data import main as cli_main
    from embodied_r.config import load_recipe
    from embodied_r.pipeline import plan

    src = _mirror(tmp_path / "mirror")
    assert cli_main(["fetch", "--source", str(src)]) == 0
    printed = capsys.readouterr().out
    assert "EmbodiedCity/UrbanVideo-Bench at not recorded (13 files)" in printed
    assert cli_main(["catalog", "--source", str(src), "--tasks", "all"]) == 0
    printed = capsys.readouterr().out
    assert "Object Recall" in printed and "object_counting" in printed
    assert "2 rows left out (answer_not_an_option: 1, video_missing: 1)" in printed
    # The same folders a pipeline run with these settings uses, so it finds the work done.
    stages = plan(load_recipe("paper", {"download": {"source": "local", "source_dir": str(src)},
                                        "catalog": {"tasks": "all"}}))
    assert stages["download"].complete and stages["preprocess"].complete
    assert str(stages["preprocess"].out) in printed


def test_catalog_out_may_be_an_empty_folder_made_ahead(tmp_path, capsys):
    from embodied_r.apps.cli_data import main as cli_main

    src = _mirror(tmp_path / "mirror")
    out = tmp_path / "made-first"
    out.mkdir()
    assert cli_main(["catalog", "--source", str(src), "--out", str(out)]) == 0
    assert (out / "catalog.parquet").is_file() and (out / "summary.json").is_file()
    capsys.readouterr()
    # A finished catalog is not overwritten without --force, and the error names the flag.
    assert cli_main(["catalog", "--source", str(src), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert cli_main(["catalog", "--source", str(src), "--out", str(out), "--force"]) == 0
    # An empty folder with --force is written into as well.
    other = tmp_path / "empty-forced"
    other.mkdir()
    assert cli_main(["catalog", "--source", str(src), "--out", str(other), "--force"]) == 0
    assert (other / "catalog.parquet").is_file()
    # A folder holding someone else's files is never deleted, --force or not.
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert cli_main(["catalog", "--source", str(src), "--out", str(foreign), "--force"]) == 2
    assert (foreign / "notes.txt").read_text() == "mine"
    assert "not an empty folder" in capsys.readouterr().err


@pytest.mark.parametrize("escape", ["../../../outside.mp4", "../../outside.mp4", "/abs/outside.mp4"])
def test_a_row_whose_video_path_leaves_its_benchmark_is_refused_not_missing(tmp_path, escape):
    """A file outside the benchmark that exists is not read, and one that does not is not
    called missing: the path itself is refused, so the reason says so and names the fix."""
    raw = tmp_path / "raw"
    uv = raw / urbanvideo.BENCHMARK.folder
    (uv / "videos").mkdir(parents=True)
    (uv / "videos" / "inside.mp4").write_bytes(b"video bytes")
    (tmp_path / "outside.mp4").write_bytes(b"not the benchmark's")  # what ../../../ reaches
    question = "Question: Where?\nChoices:\nA. Left.\nB. Right."
    rows = [{"Question_id": i, "video_id": vid, "question_category": "Landmark Position", "question": question,
             "answer": "A"} for i, vid in enumerate(["inside.mp4", escape])]
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema(urbanvideo.COLUMNS)), uv / urbanvideo.FILE)
    out = tmp_path / "catalog"
    summary = run_catalog(raw, out, CatalogConfig())
    assert [r["video_id"] for r in pq.read_table(out / "catalog.parquet").to_pylist()] == ["inside.mp4"]
    assert summary["failure_reasons"] == {"path_outside_benchmark": 1}
    (reason,) = [r["reason"] for r in pq.read_table(out / "failures.parquet").to_pylist()]
    assert reason.startswith(f"path_outside_benchmark: video {escape!r} leaves {uv}")
    assert "fix its video id" in reason and "\n" not in reason
