"""``perception.on_failure``: a call that fails after its retries drops its question, or, as the
official code did, keeps it with "None" for that frame; either way the failed calls are
counted. Against a recording OpenAI-compatible server on 127.0.0.1 that refuses chosen calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from embodied_r.backends.images import image_data_url
from embodied_r.config import load_recipe
from embodied_r.perception.stage import run_perception
from tests.perception.test_perception import make_inputs
from tests.perception.test_perception_http import RecordingServer, stage_cfg


def run(tmp_path: Path, mode: str, on_failure: str) -> tuple[dict[str, Any], dict[str, str], list[dict], int]:
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    first_a = image_data_url(str(kf / "frames/a/000.jpg"), 64 * 64)
    last_b = image_data_url(str(kf / "frames/b/001.jpg"), 64 * 64)

    def fault(body: dict[str, Any]) -> tuple[int, str] | None:
        # Refused as bad input (a 400, not retried): video a's first frame shown alone, and
        # every call that shows b's last key frame.
        text = json.dumps(body)
        alone = text.count('"type": "image_url"') == 1
        return (400, "image rejected") if (first_a in text and alone) or last_b in text else None

    srv = RecordingServer(fault=fault)
    cfg = stage_cfg(srv, mode).model_copy(update={"on_failure": on_failure, "max_failed_fraction": 1.0})
    try:
        summary = run_perception(catalog, kf, tmp_path / "out", cfg)
    finally:
        srv.stop()
    text = {r["uid"]: r["video_text"] for r in pq.read_table(tmp_path / "out" / "perception.parquet").to_pylist()}
    fails = pq.read_table(tmp_path / "out" / "failures.parquet").to_pylist()
    return summary, text, fails, len(srv.bodies)


def test_keep_placeholder_keeps_every_question_with_none_for_the_failed_frames(tmp_path: Path) -> None:
    summary, text, fails, sent = run(tmp_path, "per_question", "keep_placeholder")
    assert set(text) == {"q:1", "q:2", "q:3"} and fails == []
    assert text["q:1"].split("\n")[0] == "Frame 0: Observe: None"
    assert text["q:1"].split("\n")[1].startswith("Frame 1: After rotate right, Observe: ")
    assert text["q:3"].split("\n")[1] == "Frame 1: After None, Observe: None"
    # Counted, not hidden: 3 failed calls, 3 frames and 3 questions on a placeholder.
    assert summary["calls_failed"] == 3 and summary["calls_skipped"] == 0 and sent == 8
    assert summary["placeholder_frames"] == 3 and summary["questions_with_placeholder"] == 3
    assert summary["done"] == 3 and summary["failed"] == 0 and summary["on_failure"] == "keep_placeholder"
    assert summary["parsed_as"]["failed"] == 3


def test_drop_leaves_the_questions_out_and_lists_them(tmp_path: Path) -> None:
    summary, text, fails, sent = run(tmp_path, "per_question", "drop")
    assert text == {} and sorted(f["item"] for f in fails) == ["q:1", "q:2", "q:3"]
    assert summary["calls_failed"] == 3 and summary["failed"] == 3 and summary["reasons"] == {"call_failed": 3}
    assert summary["questions_with_placeholder"] == 0 and summary["placeholder_frames"] == 0


def test_keep_placeholder_per_video(tmp_path: Path) -> None:
    summary, text, fails, _ = run(tmp_path, "per_video", "keep_placeholder")
    assert set(text) == {"q:1", "q:2", "q:3"} and fails == []
    # The question passes that need a failed video call are still sent.
    # (q:3's question pass shows b's last frame too, and is refused as well.)
    assert summary["calls_failed"] == 3 and summary["calls_skipped"] == 0
    assert text["q:1"].split("\n")[0] == "Frame 0: Observe: None"
    assert text["q:3"].split("\n")[1] == "Frame 1: After None, Observe: None"
    assert summary["questions_with_placeholder"] == 3


def test_the_recipes_treat_failed_calls_as_their_source() -> None:
    modes = {n: load_recipe(n).perception.on_failure
             for n in ("paper", "official-script", "official-script-5gpu", "improved", "demo")}
    assert modes == {"paper": "keep_placeholder", "official-script": "keep_placeholder",
                     "official-script-5gpu": "keep_placeholder", "improved": "drop", "demo": "drop"}


@pytest.mark.parametrize("value", ["keep", ""])
def test_an_unknown_value_is_refused(value: str) -> None:
    from embodied_r.perception.config import PerceptionConfig

    with pytest.raises(ValueError, match="on_failure"):
        PerceptionConfig(on_failure=value)


def test_perception_stopped_by_videos_without_key_frames_names_them_and_their_list(tmp_path: Path, capfd) -> None:
    """Two videos of a local mirror are cut short (no moov atom): the key-frame stage leaves
    them out with FFmpeg's own words attached, none of them on the terminal, and the perception
    stage, stopped by their questions, names the videos and the file listing them."""
    from embodied_r import schemas
    from embodied_r.errors import TooManyFailures
    from embodied_r.io import table_from_records, write_parquet_atomic
    from embodied_r.keyframes.config import KeyframeConfig
    from embodied_r.keyframes.stage import run_keyframes
    from embodied_r.synthetic.world import write_motion_video

    videos = tmp_path / "videos"
    videos.mkdir()
    good = write_motion_video(videos / "good.mp4", [("fly forward", 4.0, 1.0), ("turn left", 2.0, 30.0)], width=160, height=90, fps=10.0)
    for name in ("cut_a", "cut_b"):
        (videos / f"{name}.mp4").write_bytes(good.read_bytes()[:2048])  # the moov atom is at the end
    rows = [{"uid": f"q:{vid}", "benchmark": "urbanvideo", "original_id": vid, "video_id": vid,
             "video_path": str(videos / f"{vid}.mp4"), "scene": vid, "category": "Landmark Position",
             "question": "Where is the landmark?", "options": ["A. left", "B. right"], "answer": "A",
             "answer_type": "choice", "split": "train", "fold": 0} for vid in ("good", "cut_a", "cut_b")]
    catalog = tmp_path / "catalog.parquet"
    write_parquet_atomic(table_from_records(rows, schemas.CATALOG), catalog)
    capfd.readouterr()
    kf = tmp_path / "keyframes"
    summary = run_keyframes(catalog, kf, KeyframeConfig(workers=1, cache=False))
    printed = capfd.readouterr()
    assert summary["failed"] == 2 and "moov atom" not in printed.err + printed.out
    listed = {r["item"]: r["reason"] for r in pq.read_table(kf / "failures.parquet").to_pylist()}
    assert set(listed) == {"cut_a", "cut_b"}
    assert all("cut_" in why and "FFmpeg says: moov atom not found" in why for why in listed.values()), listed

    srv = RecordingServer()
    try:
        with pytest.raises(TooManyFailures) as stopped:
            run_perception(catalog, kf, tmp_path / "out", stage_cfg(srv, "per_question"))
    finally:
        srv.stop()
    line = str(stopped.value)
    assert "\n" not in line and "no_keyframes" in line
    assert "2 video(s) have no key frames (cut_a, cut_b)" in line and str(kf / "failures.parquet") in line
