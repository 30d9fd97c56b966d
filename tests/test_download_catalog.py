"""Download from a local mirror, safe zip extraction, and the catalog with its splits."""

import os
import stat
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied_r import benchmarks as bm
from embodied_r import schemas
from embodied_r.catalog import CatalogConfig, CatalogError, SplitConfig, assign_splits, run_catalog
from embodied_r.download import DataSourceError, DownloadConfig, run_download, safe_extract


def _mirror(root: Path) -> Path:
    """A local mirror laid out like the two hub repos, with tiny stand-in video files."""
    uv = root / bm.URBANVIDEO_DIR
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
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.URBANVIDEO_MCQ), uv / bm.URBANVIDEO_FILE)

    vsi = root / bm.VSIBENCH_DIR
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
    pq.write_table(pa.Table.from_pylist(vrows, schema=schemas.VSIBENCH), vsi / bm.VSIBENCH_FILE)
    return root


def test_local_download_and_catalog(tmp_path):
    src = _mirror(tmp_path / "mirror")
    before = {p: p.stat().st_mtime_ns for p in src.rglob("*")}
    cfg = DownloadConfig(source="local", source_dir=str(src))
    summary = run_download(tmp_path / "raw", cfg, tmp_path / "sources")
    assert summary["videos"] == 12 + 4
    assert (tmp_path / "raw" / bm.VSIBENCH_DIR / "videos" / "scannet" / "scene0001_00.mp4").is_file()
    assert {p: p.stat().st_mtime_ns for p in src.rglob("*")} == before  # source untouched
    assert run_download(tmp_path / "raw", cfg, tmp_path / "sources") == summary  # finished work reused

    out = tmp_path / "catalog"
    cat = run_catalog(tmp_path / "raw", out, CatalogConfig())
    rows = pq.read_table(out / "catalog.parquet").to_pylist()
    assert pq.read_schema(out / "catalog.parquet").remove_metadata() == schemas.CATALOG
    cats = {r["category"] for r in rows}
    assert "Object Recall" not in cats and "object_counting" not in cats  # paper subset only
    assert "object_rel_direction" in cats
    # One row's video is missing and one row's answer is not an option: both counted, not kept.
    assert cat["failed"] == 2
    reasons = {r["reason"].split(":")[0] for r in pq.read_table(out / "failures.parquet").to_pylist()}
    assert reasons == {"video missing", "answer 'Z' is not one of the parsed options"}
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
    uv = tmp_path / "raw" / bm.URBANVIDEO_DIR
    uv.mkdir(parents=True)
    pq.write_table(pa.table({"Question_id": [1], "video_id": ["x.mp4"]}), uv / bm.URBANVIDEO_FILE)
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
