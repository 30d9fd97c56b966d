"""Key frames cached by video content and parameters, shared across stage runs."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embodied_r import schemas
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.stage import run_keyframes
from embodied_r.keyframes.cache import ENTRY_FILE, cached_keyframes, params_hash
from embodied_r.synthetic.world import write_motion_video
from embodied_r.errors import VideoError


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("clips")
    return {"pan": write_motion_video(d / "pan.mp4", [("turn right", 4.0, 20.0)], seed=2),
            "rise": write_motion_video(d / "rise.mp4", [("rise", 3.0, 6.0), ("turn left", 2.0, 50.0)], seed=3)}


def _catalog(path: Path, entries: list[tuple[str, Path]]) -> Path:
    rows = [{"uid": f"q{i}", "benchmark": "vsibench", "original_id": str(i), "video_id": vid, "video_path": str(p),
             "scene": vid, "category": "x", "question": "q", "options": [], "answer": "1", "answer_type": "number",
             "split": "test", "fold": 0} for i, (vid, p) in enumerate(entries)]
    write_parquet_atomic(table_from_records(rows, schemas.CATALOG), path)
    return path


def _same(a: object, b: object) -> bool:
    """Equal as JSON (the first overlap is NaN, which never equals itself)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir()) if root.exists() else []


def test_a_later_stage_run_reuses_frames_of_the_same_video_content(tmp_path, clips):
    cache = tmp_path / "cache"
    cfg = KeyframeConfig(workers=1, cache_dir=str(cache))
    first = run_keyframes(_catalog(tmp_path / "a.parquet", [("pan", clips["pan"]), ("rise", clips["rise"])]),
                          tmp_path / "kf-a", cfg)
    assert first["cache_hits"] == 0 and first["done"] == 2 and len(_entries(cache)) == 2
    # Another catalog names the same bytes otherwise and keeps them elsewhere; other workers too.
    elsewhere = tmp_path / "other" / "scannet_scene0001_00.mp4"
    elsewhere.parent.mkdir()
    shutil.copyfile(clips["pan"], elsewhere)
    second = run_keyframes(_catalog(tmp_path / "b.parquet", [("scannet/scene0001_00", elsewhere)]),
                           tmp_path / "kf-b", cfg.model_copy(update={"workers": 2}))
    assert second["cache_hits"] == 1 and second["frames_decoded"] == 0 and second["processing_seconds"] == 0
    assert second["hash_seconds"] >= 0 and len(_entries(cache)) == 2
    a = [r for r in pq.read_table(tmp_path / "kf-a" / "keyframes.parquet").to_pylist() if r["video_id"] == "pan"]
    b = pq.read_table(tmp_path / "kf-b" / "keyframes.parquet").to_pylist()
    assert [(r["frame_index"], r["reason"], r["rank"]) for r in a] == [(r["frame_index"], r["reason"], r["rank"])
                                                                        for r in b]
    for ra, rb in zip(a, b):
        img_a, img_b = tmp_path / "kf-a" / ra["image_path"], tmp_path / "kf-b" / rb["image_path"]
        assert img_a.read_bytes() == img_b.read_bytes()
        assert os.path.samefile(img_a, img_b)  # linked from the cache entry, not a second copy
    assert not list((tmp_path / "kf-b" / "frames").rglob(ENTRY_FILE))


def test_other_parameters_miss_and_spreading_settings_do_not(tmp_path, clips):
    cfg = KeyframeConfig(cache_dir=str(tmp_path / "cache"))
    spread = {"workers": 3, "cv_threads": 1, "decode_threads": 4, "decode_ahead": 0, "cache_dir": "/x"}
    assert params_hash(cfg) == params_hash(cfg.model_copy(update=spread))
    assert params_hash(cfg) != params_hash(cfg.model_copy(update={"jpeg_quality": 80}))
    root = tmp_path / "cache"
    one = cached_keyframes(clips["rise"], cfg, root)
    again = cached_keyframes(clips["rise"], cfg, root)
    other = cached_keyframes(clips["rise"], cfg.model_copy(update={"overlap_threshold": 0.9}), root)
    assert (one.hit, again.hit, other.hit) == (False, True, False)
    assert again.folder == one.folder != other.folder and again.extract_seconds == 0
    assert _same(again.meta["frames"], one.meta["frames"]) and one.meta["video_sha256"] in one.folder.name
    assert len(other.meta["frames"]) >= len(one.meta["frames"])  # a higher threshold keeps more
    # An entry damaged by hand is filled again rather than trusted.
    (one.folder / ENTRY_FILE).unlink()
    assert cached_keyframes(clips["rise"], cfg, root).hit is False
    assert (one.folder / ENTRY_FILE).is_file()
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary folders left


def test_two_processes_filling_one_entry_agree(tmp_path, clips):
    cfg = KeyframeConfig(cache_dir=str(tmp_path / "cache"))
    results, errors = [], []

    def fill() -> None:
        try:
            results.append(cached_keyframes(clips["pan"], cfg, tmp_path / "cache"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fill) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 2
    assert results[0].folder == results[1].folder and _same(results[0].meta["frames"], results[1].meta["frames"])
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [results[0].folder.name]
    names = sorted(p.name for p in results[0].folder.iterdir())
    assert names == sorted([ENTRY_FILE] + [f["file"] for f in results[0].meta["frames"]])


def test_bad_videos_are_not_cached_and_the_cache_can_be_off(tmp_path, clips):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(os.urandom(4000))
    root = tmp_path / "cache"
    cfg = KeyframeConfig(cache_dir=str(root))
    with pytest.raises(VideoError, match="unreadable"):
        cached_keyframes(junk, cfg, root)
    with pytest.raises(VideoError, match="missing"):
        cached_keyframes(tmp_path / "none.mp4", cfg, root)
    assert _entries(root) == []
    off = KeyframeConfig(workers=1, cache=False, cache_dir=str(tmp_path / "unused"))
    summary = run_keyframes(_catalog(tmp_path / "c.parquet", [("pan", clips["pan"]), ("junk", junk)]),
                            tmp_path / "kf", off)
    assert (summary["done"], summary["failed"], summary["cache_hits"]) == (1, 1, 0)
    assert not (tmp_path / "unused").exists()
    rows = pq.read_table(tmp_path / "kf" / "keyframes.parquet").to_pylist()
    assert rows and all((tmp_path / "kf" / r["image_path"]).is_file() for r in rows)
    assert not list((tmp_path / "kf" / "frames").rglob(ENTRY_FILE))
