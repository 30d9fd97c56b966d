"""The key-frame rule and the key-frame stage, on synthetic videos made on the spot."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import struct
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest

from embodied_r import schemas
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.keyframes.extract import extract_keyframes, fill_indices, thin_evenly
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.stage import run_keyframes
from embodied_r.keyframes.stage import safe_name
from embodied_r.synthetic.world import write_motion_video
from embodied_r.keyframes.video import encode_jpeg, read_frames
from embodied_r.errors import VideoError
from tests.killing import kill_at_item


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("videos")
    plans = {
        "static": [("hover", 6.0, 0.0)],
        "fast": [("turn right", 8.0, 80.0)],  # 80 degrees a second against a 60-degree view
        "pan": [("turn right", 5.0, 12.0)],  # a fifth of the view a second
        "forward": [("fly forward", 4.0, 1.25)],
        "mixed": [("turn left", 2.0, 20.0), ("rise", 1.0, 4.0), ("turn right", 2.0, 70.0)],
    }
    return {k: write_motion_video(d / f"{k}.mp4", m, seed=5) for k, m in plans.items()}


def test_static_video_keeps_first_last_and_fills(videos):
    r = extract_keyframes(videos["static"])
    assert r.n_frames == 180 and r.fps == pytest.approx(30.0)
    assert r.indices[0] == 0 and r.indices[-1] == 179
    assert r.reasons[0] == "first" and r.reasons[-1] == "last"
    assert len(r) == 4 and r.reasons.count("fill") == 2 and r.indices == sorted(set(r.indices))
    assert r.overlaps[-1] > 0.95  # nothing moved
    assert [t for t in r.timestamps] == pytest.approx([i / 30 for i in r.indices])
    assert len(r.images) == 4 and all(cv2.imdecode(np.frombuffer(b, np.uint8), 1) is not None for b in r.images)


def test_fast_turn_keeps_every_sample_and_more_than_static(videos):
    fast, static = extract_keyframes(videos["fast"]), extract_keyframes(videos["static"])
    assert fast.n_samples == 9  # frames 0, 30, ..., 210 and the last, 239
    assert fast.indices == [0, 30, 60, 90, 120, 150, 180, 210, 239]
    assert set(fast.reasons[1:-1]) <= {"match_failed", "low_overlap"} and fast.reasons[-1] == "last"
    assert len(fast) > len(static) and "fill" not in fast.reasons


def test_overlap_rule_measures_the_true_overlap(videos):
    # A pan of 12 degrees/s across a 60-degree view overlaps by 1 - 12t/60: 0.8, 0.6, then 0.4 < 0.5.
    pan = extract_keyframes(videos["pan"])
    found = [(i, o) for i, o, why in zip(pan.indices, pan.overlaps, pan.reasons) if why == "low_overlap"]
    assert found[0][0] == 90 and found[0][1] == pytest.approx(0.4, abs=0.04)
    # Flying forward zooms 1.25x a second: the old view's share is 1/1.25^(2t), 0.64 then 0.41.
    fwd = extract_keyframes(videos["forward"])
    found = [(i, o) for i, o, why in zip(fwd.indices, fwd.overlaps, fwd.reasons) if why == "low_overlap"]
    assert found[0][0] == 60 and found[0][1] == pytest.approx(0.41, abs=0.04)
    assert all(o < 0.5 for _, o in found)


def test_clamping_both_ways(videos):
    few = extract_keyframes(videos["static"], KeyframeConfig(min_frames=7))
    assert len(few) == 7 and few.indices[0] == 0 and few.indices[-1] == 179
    many = extract_keyframes(videos["fast"], KeyframeConfig(max_frames=5))
    assert len(many) == 5 and many.indices[0] == 0 and many.indices[-1] == 239
    assert many.reasons[0] == "first" and many.reasons[-1] == "last"
    # 16 degrees between samples leaves 0.73 overlap, under a 0.9 threshold: 41 key frames, thinned.
    dense = extract_keyframes(videos["fast"], KeyframeConfig(sample_fps=5.0, overlap_threshold=0.9))
    assert dense.n_samples == 41 and len(dense) == 32 and "fill" not in dense.reasons
    assert dense.indices[0] == 0 and dense.indices[-1] == 239
    with pytest.raises(ValueError):
        KeyframeConfig(min_frames=8, max_frames=4)
    with pytest.raises(ValueError):
        KeyframeConfig(overlap_thresold=0.4)  # unknown keys are refused, not ignored


def test_fill_and_thin_are_even():
    assert fill_indices([0, 299], 300, 4) == [100, 199]
    assert fill_indices([0, 1], 3, 4) == [2]  # never more frames than the video has
    assert thin_evenly(list(range(10)), 4) == [0, 3, 6, 9]
    assert thin_evenly([1, 2, 3], 4) == [1, 2, 3]


def _miscounted_avi(src: Path, dst: Path, claimed: int) -> Path:
    """Copy a video to MJPEG AVI whose headers claim ``claimed`` frames: a container that lies."""
    cap = cv2.VideoCapture(str(src))
    out = cv2.VideoWriter(str(dst), cv2.VideoWriter_fourcc(*"MJPG"), cap.get(cv2.CAP_PROP_FPS),
                          (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))))
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        out.write(frame)
    out.release()
    data = bytearray(dst.read_bytes())
    strh, avih = data.find(b"strh"), data.find(b"avih")
    data[strh + 40:strh + 44] = struct.pack("<I", claimed)  # stream length
    data[avih + 24:avih + 28] = struct.pack("<I", claimed)  # total frames
    dst.write_bytes(bytes(data))
    assert cv2.VideoCapture(str(dst)).get(cv2.CAP_PROP_FRAME_COUNT) == claimed
    return dst


@pytest.mark.parametrize("claimed", [100, 300])
def test_miscounted_frames_still_keep_the_true_last_frame(tmp_path, videos, claimed):
    video = _miscounted_avi(videos["static"], tmp_path / "static.avi", claimed)  # 180 real frames
    r = extract_keyframes(video)
    assert r.n_frames == 180 and r.indices[0] == 0 and r.indices[-1] == 179 and r.reasons[-1] == "last"
    assert len(r) == 4 and r.indices == [0, 60, 120, 179]
    # Top-up frames planned from a wrong count are decoded again (one pass); an over-count also
    # hides the true end until the stream stops, so the last frame takes a pass of its own.
    assert r.passes == (3 if claimed > 180 else 2)
    cfg = KeyframeConfig()
    frames = read_frames(video, r.indices)
    assert r.images == [encode_jpeg(frames[i], cfg) for i in r.indices]


def test_bad_files_raise_clear_errors(tmp_path, videos, monkeypatch):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(os.urandom(20000))
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(videos["mixed"].read_bytes()[:20000])  # the index sits at the end of the file
    for path, code in ((empty, "empty"), (junk, "unreadable"), (cut, "unreadable"),
                       (tmp_path / "none.mp4", "missing")):
        with pytest.raises(VideoError) as err:
            extract_keyframes(path)
        assert err.value.code == code and str(path) in str(err.value)

    # FFmpeg guesses a rate for any file it opens, so a zero rate is simulated.
    real = cv2.VideoCapture

    class NoFps:
        def __init__(self, *args):
            self.cap = real(*args)

        def get(self, prop):
            return 0.0 if prop == cv2.CAP_PROP_FPS else self.cap.get(prop)

        def __getattr__(self, name):
            return getattr(self.cap, name)

    monkeypatch.setattr("embodied_r.keyframes.video.cv2.VideoCapture", NoFps)
    with pytest.raises(VideoError, match="no_fps"):
        extract_keyframes(videos["static"])


def test_safe_name_is_unique_and_clean():
    assert safe_name("EmbodiedCity_12_0.mp4") == "EmbodiedCity_12_0.mp4"
    a, b = safe_name("scannet/scene0001_00"), safe_name("scannet_scene0001_00")
    assert a != b and "/" not in a


def _catalog(path: Path, entries: list[tuple[str, Path]]) -> Path:
    rows = [{"uid": f"q{i}", "benchmark": "urbanvideo", "original_id": str(i), "video_id": vid,
             "video_path": str(p), "scene": vid, "category": "x", "question": "q", "options": [],
             "answer": "A", "answer_type": "choice", "split": "train", "fold": 0}
            for i, (vid, p) in enumerate(entries)]
    write_parquet_atomic(table_from_records(rows, schemas.CATALOG), path)
    return path


def test_stage_records_bad_videos_and_finishes_the_rest(tmp_path, videos):
    empty = tmp_path / "empty.mp4"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(os.urandom(5000))
    entries = [("a/static", videos["static"]), ("fast", videos["fast"]), ("a/static", videos["static"]),
               ("junk", junk), ("mixed", videos["mixed"]), ("empty", empty)]
    catalog = _catalog(tmp_path / "catalog.parquet", entries)
    out = tmp_path / "kf"
    summary = run_keyframes(catalog, out, KeyframeConfig(workers=2))
    assert (summary["videos"], summary["done"], summary["failed"]) == (5, 3, 2)
    assert summary["failure_reasons"] == {"unreadable": 1, "empty": 1}
    assert summary["keyframes_min"] == 4 and summary["keyframes_max"] == 9
    table = pq.read_table(out / "keyframes.parquet")
    assert table.schema.remove_metadata().equals(schemas.KEYFRAMES)
    rows = table.to_pylist()
    assert {r["video_id"] for r in rows} == {"a/static", "fast", "mixed"}
    for vid in ("a/static", "fast", "mixed"):
        mine = [r for r in rows if r["video_id"] == vid]
        assert [r["rank"] for r in mine] == list(range(len(mine)))
        assert mine[0]["reason"] == "first" and mine[-1]["reason"] == "last"
        assert all((out / r["image_path"]).is_file() and r["image_path"].startswith("frames/") for r in mine)
    fails = pq.read_table(out / "failures.parquet").to_pylist()
    assert {f["item"] for f in fails} == {"junk", "empty"} and all(f["stage"] == "keyframes" for f in fails)
    assert cv2.imread(str(out / "montage.jpg")) is not None
    assert json.loads((out / "summary.json").read_text())["done"] == 3
    assert run_keyframes(catalog, out, KeyframeConfig(workers=2)) == summary  # complete: not redone


def test_pool_workers_are_born_deaf_to_ctrl_c(tmp_path, videos):
    """Each pool worker has SIGINT blocked from its first instruction (it inherits the mask),
    so a terminal's Ctrl-C while it still imports cannot print a traceback under the run's
    one line; the parent ends it."""
    from embodied_r.apps.reaper import descendants
    from embodied_r.keyframes.stage import _process_all

    todo = [("static", str(videos["static"])), ("pan", str(videos["pan"]))]
    records = _process_all(todo, tmp_path, KeyframeConfig(), None, workers=2, threads=1)
    next(records)
    workers = [pid for pid in descendants(os.getpid())
               if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    blocked = {pid: int(re.search(r"^SigBlk:\s*([0-9a-f]+)", Path(f"/proc/{pid}/status").read_text(), re.M)
                        .group(1), 16) for pid in workers}
    list(records)
    assert len(workers) == 2
    assert all(mask & (1 << (signal.SIGINT - 1)) for mask in blocked.values()), blocked
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_missing_catalog_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="preprocess"):
        run_keyframes(tmp_path / "nope.parquet", tmp_path / "out")


def test_killed_run_resumes_without_repeats_or_losses(tmp_path):
    vids = {f"v{i}": write_motion_video(tmp_path / f"v{i}.mp4", [("turn right", 4.0, 25.0 + 5 * i)], seed=i)
            for i in range(8)}
    catalog = _catalog(tmp_path / "catalog.parquet", list(vids.items()))
    out = tmp_path / "kf"
    cfg = {"workers": 2}
    script = textwrap.dedent(f"""
        from pathlib import Path
        from embodied_r.keyframes.config import KeyframeConfig
        from embodied_r.keyframes.stage import run_keyframes
        run_keyframes(Path({str(catalog)!r}), Path({str(out)!r}), KeyframeConfig(**{cfg!r}))
    """)
    # The run and its pool workers, killed once two videos are logged.
    kill_at_item(script, "keyframes", 2, tmp_path)
    assert not out.exists()
    work = tmp_path / "kf.partial"
    first = [json.loads(x)["video_id"] for x in (work / "items.jsonl").read_text().splitlines()]
    assert len(first) == 2
    done_images = {p: (p.stat().st_ino, p.stat().st_mtime_ns)
                   for vid in first for p in (work / "frames" / safe_name(vid)).iterdir()}
    assert done_images

    summary = run_keyframes(catalog, out, KeyframeConfig(**cfg))
    assert (summary["videos"], summary["done"], summary["failed"]) == (8, 8, 0)
    lines = [json.loads(x)["video_id"] for x in (out / "items.jsonl").read_text().splitlines()]
    assert sorted(lines) == sorted(vids) and lines[: len(first)] == first  # each video logged once
    rows = pq.read_table(out / "keyframes.parquet").to_pylist()
    assert {r["video_id"] for r in rows} == set(vids)
    # Finished before the kill, so not processed again: the same files, never rewritten.
    images = [out / r["image_path"] for r in rows if r["video_id"] in first]
    after = {work / p.relative_to(out): (p.stat().st_ino, p.stat().st_mtime_ns) for p in images}
    assert after == done_images
    assert not math.isnan(summary["keyframes_mean"])
