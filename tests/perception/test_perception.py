"""Perception: prompts, parsing, the video text, and the stage end to end."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from pydantic import ValidationError

from embodied_r import schemas
from embodied_r.backends.base import BackendConfig
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.perception.stage import run_perception
from embodied_r.perception.config import PerceptionConfig
from embodied_r.perception.parse import FrameInfo, normalize_action, parse_frame_response, video_text
from embodied_r.perception.prompts import ACTIONS, PromptStyle, first_frame_conversation, pair_conversation
from tests.killing import kill_at_item


# -- parsing ------------------------------------------------------------------------------


def test_parse_json() -> None:
    info = parse_frame_response(
        '{"action": "rotate left", "new_info": "a bridge ahead", "question_info": "the tower is left"}',
        first=False,
    )
    assert (info.action, info.new_info, info.question_info, info.parsed_as) == (
        "rotate left", "a bridge ahead", "the tower is left", "json"
    )


def test_parse_fenced_json_with_prose_and_odd_values() -> None:
    text = (
        "Sure! Here is my analysis.\n```json\n"
        '{"Action": "Turn_Right", "New Info": ["a red car", "a tree"], '
        '"question_related_objects": {"tower": "far right"}}\n```\nHope this helps {not json}.'
    )
    info = parse_frame_response(text, first=False)
    assert info.parsed_as == "json"
    assert info.action == "rotate right"
    assert info.new_info == "a red car; a tree"
    assert info.question_info == "tower: far right"


def test_parse_labelled_text() -> None:
    text = (
        "1. **Action:** moved forward toward the gate\n"
        "2. New spatial information: a fountain appears\n   on the left side.\n"
        "3. Question-related objects: the gate, straight ahead"
    )
    info = parse_frame_response(text, first=False)
    assert info.parsed_as == "labels"
    assert info.action == "move forward"
    assert info.new_info == "a fountain appears on the left side."
    assert info.question_info == "the gate, straight ahead"


def test_parse_garbage_and_first_frame() -> None:
    info = parse_frame_response("zq## 1. 2. 3. lorem ipsum", first=False)
    assert info.action == "unknown" and info.parsed_as == "text"
    assert info.new_info == "zq## 1. 2. 3. lorem ipsum"
    assert parse_frame_response("", first=False).action == "unknown"
    first = parse_frame_response('{"new_info": "a kitchen", "question_info": "a sink on the right"}', first=True)
    assert (first.action, first.new_info, first.question_info) == ("", "a kitchen", "a sink on the right")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("move forward", "move forward"),
        ("MOVE-FORWARD.", "move forward"),
        ("The agent turned left, then moved forward", "rotate left"),  # the first one named
        ("rotating right", "rotate right"),
        ("flew upward", "move up"),
        ("Move upward.", "move up"),
        ("tilt downward", "tilt down"),
        ("moving backwards", "move backward"),
        ("Moving forward, then turn left", "move forward"),
        ("yaw right", "rotate right"),
        ("descend slowly", "move down"),
        ("look up at the sky", "tilt up"),
        ("move backward", "move backward"),
        ("hover in place", "unknown"),
        (None, "unknown"),
        (["move up"], "unknown"),
    ],
)
def test_normalize_action(text: object, expected: str) -> None:
    assert normalize_action(text) == expected
    assert expected in ACTIONS or expected == "unknown"


def test_video_text_format() -> None:
    frames = [
        FrameInfo("", "a street,\n cars parked", "the tower is far ahead", "json"),
        FrameInfo("move forward", "a bridge", "", "json"),
        FrameInfo("unknown", "", "tower on the left", "text"),
    ]
    assert video_text(frames, "Question-related:") == (
        "Frame 0: Observe: a street, cars parked Question-related: the tower is far ahead\n"
        "Frame 1: After move forward, Observe: a bridge\n"
        "Frame 2: After unknown, Observe: Question-related: tower on the left"
    )
    # The official text: the question-related part follows after a space, unlabelled.
    assert video_text(frames).splitlines()[0] == "Frame 0: Observe: a street, cars parked the tower is far ahead"
    assert PerceptionConfig(question_label="Question-related:").video_text(frames) == video_text(
        frames, "Question-related:")


def test_conversations_put_images_first_when_asked() -> None:
    style = PromptStyle("json", "images_first", True)
    conv = pair_conversation("/k/0.jpg", "/k/1.jpg", "Where is the tower?\nA. left\nB. right", style)
    assert conv[0]["role"] == "system"
    parts = conv[1]["content"]
    assert [p["type"] for p in parts] == ["image", "image", "text"]
    assert [p["path"] for p in parts[:2]] == ["/k/0.jpg", "/k/1.jpg"]
    assert parts[2]["text"].endswith("Question: Where is the tower?\nA. left\nB. right")
    assert all(a in parts[2]["text"] for a in ACTIONS) and "JSON" in parts[2]["text"]
    first = first_frame_conversation("/k/0.jpg", "Q", style)[1]["content"]
    assert [p["type"] for p in first] == ["image", "text"] and "Do not answer" in first[1]["text"]


def test_conversations_in_the_official_form() -> None:
    conv = pair_conversation("/k/0.jpg", "/k/1.jpg", "Where is the tower?\nA. left\nB. right")
    assert [m["role"] for m in conv] == ["user"]
    parts = conv[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "image"]
    assert [p["path"] for p in parts[1:]] == ["/k/0.jpg", "/k/1.jpg"]
    assert "JSON" not in parts[0]["text"] and "1. Action:" in parts[0]["text"]
    first = first_frame_conversation("/k/0.jpg", "Q")[0]["content"]
    assert [p["type"] for p in first] == ["text", "image"] and "Do not answer" in first[0]["text"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1. Move forward.\n2. A tall red building to the front-left.\n3. The tower is ahead.",
         ("move forward", "A tall red building to the front-left.", "The tower is ahead.")),
        ("### 1. **Action:** Rotate left\n### 2. **New information:** a blue bridge\n### 3. Question objects: none",
         ("rotate left", "a blue bridge", "none")),
        ("1. Move upward 2. A grey rooftop below. 3. The park is not visible.",
         ("move up", "A grey rooftop below.", "The park is not visible.")),
        ("Sure.\n1) tilt downward\n2) the sky is gone\n", ("tilt down", "the sky is gone", "")),
        ("1. Move forward\n2. There are 3. floors visible\n3. the tower",
         ("move forward", "There are 3. floors visible", "the tower")),
        ("(1) rotate right\n(2) a white van\n   parked on the right\n(3) the gate, ahead",
         ("rotate right", "a white van\n   parked on the right", "the gate, ahead")),
    ],
)
def test_parse_numbered(text: str, expected: tuple[str, str, str]) -> None:
    info = parse_frame_response(text, first=False, reply_format="numbered")
    assert (info.action, info.new_info, info.question_info) == expected and info.parsed_as == "numbered"


def test_parse_numbered_falls_back_and_reads_first_frames_whole() -> None:
    info = parse_frame_response('{"action": "move left", "new_info": "x"}', first=False, reply_format="numbered")
    assert (info.action, info.new_info, info.parsed_as) == ("move left", "x", "json")
    info = parse_frame_response("The agent flies on; a car appears.", first=False, reply_format="numbered")
    assert (info.action, info.new_info, info.parsed_as) == ("unknown", "The agent flies on; a car appears.", "text")
    first = parse_frame_response("1. A street.\n2. Cars parked.", first=True, reply_format="numbered")
    assert (first.action, first.new_info, first.question_info) == ("", "1. A street.\n2. Cars parked.", "")
    first = parse_frame_response('{"new_info": "a hall", "question_info": "a door"}', first=True,
                                 reply_format="numbered")
    assert (first.new_info, first.question_info, first.parsed_as) == ("a hall", "a door", "json")
    # A JSON-style reply that came back numbered is still read.
    info = parse_frame_response("1. rotate left\n2. a bridge\n3. none", first=False)
    assert (info.action, info.new_info, info.parsed_as) == ("rotate left", "a bridge", "numbered")


def test_config() -> None:
    cfg = PerceptionConfig()
    assert cfg.backend.model == "Qwen/Qwen2.5-VL-72B-Instruct" and cfg.mode == "per_question"
    with pytest.raises(ValidationError):
        PerceptionConfig(prompt_version="0")
    assert PerceptionConfig(mode="per_video").mode == "per_video"
    with pytest.raises(ValidationError):
        PerceptionConfig(mode="per_frame")
    with pytest.raises(ValidationError):
        PerceptionConfig(batch=3)


# -- the stage ----------------------------------------------------------------------------


def make_inputs(root: Path, videos: dict[str, int], questions: list[tuple[str, str]]) -> tuple[Path, Path]:
    """A catalog and a key-frame stage folder: ``videos`` maps id -> number of key frames,
    ``questions`` lists (uid, video_id)."""
    kf = root / "keyframes"
    rng = np.random.default_rng(1)
    rows = []
    for vid, n in videos.items():
        for rank in range(n):
            rel = f"frames/{vid}/{rank:03d}.jpg"
            (kf / rel).parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (120, 200, 3), dtype=np.uint8)).save(kf / rel)
            rows.append(
                {"video_id": vid, "rank": rank, "frame_index": rank * 30, "timestamp": float(rank),
                 "overlap": math.nan if rank == 0 else 0.3, "reason": "low_overlap", "image_path": rel}
            )
    rows.reverse()  # readers must order by rank, not trust the file order
    write_parquet_atomic(table_from_records(rows, schemas.KEYFRAMES), kf / "keyframes.parquet")
    cat = [
        {"uid": uid, "benchmark": "urbanvideo", "original_id": uid, "video_id": vid,
         "video_path": f"/videos/{vid}.mp4", "scene": vid, "category": "Landmark Position",
         "question": f"Where is the landmark seen in {vid}?", "options": ["A. left", "B. right"],
         "answer": "A", "answer_type": "choice", "split": "train", "fold": 0}
        for uid, vid in questions
    ]
    write_parquet_atomic(table_from_records(cat, schemas.CATALOG), root / "catalog.parquet")
    return root / "catalog.parquet", kf


def tiny_cfg(model: Path, batch_size: int = 4, mode: str = "per_question") -> PerceptionConfig:
    return PerceptionConfig(
        backend=BackendConfig(kind="transformers", model=str(model), device="cpu",
                              batch_size=batch_size, concurrency=1, max_pixels=56 * 56),
        max_new_tokens=12, question_max_new_tokens=24, mode=mode,
        # These tests plant failing items and check they are recorded, not the threshold.
        max_failed_fraction=1.0,
    )


def test_run_perception_end_to_end(tiny_vlm_path: Path, tmp_path: Path) -> None:
    catalog, kf = make_inputs(
        tmp_path,
        {"v1": 4, "v2": 1, "v3": 3},
        [("u:1", "v1"), ("u:2", "v1"), ("u:3", "v2"), ("u:4", "v3"), ("u:5", "v_none")],
    )
    # A key frame that cannot be read: the calls that need it fail, the others go on.
    (kf / "frames/v3/002.jpg").unlink()
    out = tmp_path / "perception"
    summary = run_perception(catalog, kf, out, tiny_cfg(tiny_vlm_path))

    assert (out / "summary.json").is_file() and not (tmp_path / "perception.partial").exists()
    assert summary["questions"] == 5 and summary["done"] == 3 and summary["failed"] == 2
    assert summary["reasons"] == {"no_keyframes": 1, "call_failed": 1}
    # u:4 needs three calls; the one that reads the missing frame fails after retries.
    assert summary["calls_made"] == 4 + 4 + 1 + 3 and summary["calls_failed"] == 1
    assert summary["calls"] == summary["calls_by_kind"]["frame"] == 4 + 4 + 1 + 2
    assert summary["mode"] == "per_question" and summary["retries"] == 0
    assert summary["mean_frames"] == pytest.approx(3.0)

    per = pq.read_table(out / "perception.parquet")
    assert per.schema.equals(schemas.PERCEPTION)
    rows = {r["uid"]: r for r in per.to_pylist()}
    assert set(rows) == {"u:1", "u:2", "u:3"}
    assert rows["u:1"]["n_frames"] == 4 and rows["u:3"]["n_frames"] == 1
    lines = rows["u:1"]["video_text"].split("\n")
    assert len(lines) == 4 and lines[0].startswith("Frame 0: Observe:")
    for i, line in enumerate(lines[1:], start=1):
        assert line.startswith(f"Frame {i}: After ") and ", Observe:" in line
    # The summary counts every logged call, those of the failed question included.
    assert 0 < sum(r["prompt_tokens"] for r in rows.values()) < summary["prompt_tokens"]
    assert 0 < sum(r["completion_tokens"] for r in rows.values()) < summary["completion_tokens"]
    assert rows["u:1"]["n_calls"] == 4

    frames = pq.read_table(out / "perception_frames.parquet")
    assert frames.schema.equals(schemas.PERCEPTION_FRAMES)
    fr = frames.to_pylist()
    assert len(fr) == 9
    assert all(r["action"] == "" for r in fr if r["frame"] == 0)
    assert all(r["action"] in ACTIONS + ("unknown",) for r in fr if r["frame"] > 0)

    fails = {r["item"]: r for r in pq.read_table(out / "failures.parquet").to_pylist()}
    assert set(fails) == {"u:4", "u:5"}
    assert "no key frames for video v_none" in fails["u:5"]["reason"]
    assert "002.jpg" in fails["u:4"]["reason"] and fails["u:4"]["stage"] == "perception"
    assert fails["u:4"]["reason"].startswith("call u:4:2 failed after retries")

    # A finished folder is returned as it is, without loading a model.
    bad = PerceptionConfig(backend=BackendConfig(model="/no/such/model"))
    assert run_perception(catalog, kf, out, bad) == summary


def test_per_video_mode_against_per_question(tiny_vlm_path: Path, tmp_path: Path) -> None:
    videos = {"v1": 3, "v2": 2, "v3": 3}
    questions = [("u:1", "v1"), ("u:2", "v1"), ("u:3", "v1"), ("u:4", "v2"), ("u:5", "v3"), ("u:6", "v3")]
    catalog, kf = make_inputs(tmp_path, videos, questions)
    (kf / "frames/v3/002.jpg").unlink()  # every question of v3 rests on the failing call
    per_q = run_perception(catalog, kf, tmp_path / "pq", tiny_cfg(tiny_vlm_path, batch_size=8))
    per_v = run_perception(catalog, kf, tmp_path / "pv", tiny_cfg(tiny_vlm_path, batch_size=8, mode="per_video"))

    assert per_q["calls_made"] == 3 * 3 + 2 + 2 * 3
    # Video calls once per video (3 + 2 + 3), then one question pass per question, except
    # where a video call failed: those questions cannot finish, so no pass is sent.
    assert per_v["calls_made"] == 8 + 4 and per_v["calls_failed"] == 1 and per_v["calls_skipped"] == 2
    assert per_v["calls_by_kind"] == {"scene": 3, "pair": 4, "question": 4}
    assert per_v["mode"] == "per_video" and per_v["done"] == 4 and per_v["failed"] == 2
    fails = {r["item"]: r["reason"] for r in pq.read_table(tmp_path / "pv" / "failures.parquet").to_pylist()}
    assert set(fails) == {"u:5", "u:6"} and all(r.startswith("call video:v3:2 failed") for r in fails.values())
    assert 0 < per_v["prompt_tokens"] < per_q["prompt_tokens"]

    # The same outputs, in the same schemas.
    for name, schema in (("perception", schemas.PERCEPTION), ("perception_frames", schemas.PERCEPTION_FRAMES)):
        assert pq.read_table(tmp_path / "pv" / f"{name}.parquet").schema.equals(schema)
    rows = {r["uid"]: r for r in pq.read_table(tmp_path / "pv" / "perception.parquet").to_pylist()}
    assert set(rows) == {"u:1", "u:2", "u:3", "u:4"}
    assert rows["u:1"]["n_calls"] == 3 + 1  # its video's calls and its own question pass
    lines = rows["u:1"]["video_text"].split("\n")
    assert len(lines) == 3 and lines[0].startswith("Frame 0: Observe:") and lines[2].startswith("Frame 2: After ")
    frames = pq.read_table(tmp_path / "pv" / "perception_frames.parquet").to_pylist()
    by_q = {uid: [(r["action"], r["new_info"]) for r in frames if r["uid"] == uid] for uid in rows}
    # Action and new information are the video's, shared by all its questions.
    assert by_q["u:1"] == by_q["u:2"] == by_q["u:3"] and len(by_q["u:1"]) == 3


def test_calls_after_a_failed_one_are_not_sent(tiny_vlm_path: Path, tmp_path: Path) -> None:
    from embodied_r.backends.factory import make_backend
    from embodied_r.io import ItemLog
    from embodied_r.perception.stage import _Runner
    from embodied_r.perception.modes import PerQuestion, Question

    catalog, kf = make_inputs(tmp_path, {"v": 4}, [("u:1", "v")])
    frames = [str(kf / f"frames/v/{i:03d}.jpg") for i in range(4)]
    (kf / "frames/v/001.jpg").unlink()
    calls = PerQuestion().calls([Question("u:1", "v", "Q", frames), Question("u:2", "v", "Q", frames[:1])])
    backend = make_backend(tiny_cfg(tiny_vlm_path).backend)
    runner = _Runner(backend, ItemLog(tmp_path / "log.jsonl", key="key"), {}, structured=False)
    runner.run(calls, size=1, max_new_tokens=4)  # one call at a time, round by round
    backend.close()
    # u:1's frame 1 fails; its frames 2 and 3 are not sent, as they could not help.
    assert (runner.made, runner.failed, runner.skipped) == (3, 1, 2)
    assert set(runner.done) == {"u:1:0", "u:2:0"}
    assert runner.errors["u:1:3"] == "not sent: u:1:2 failed" and "001.jpg" in runner.errors["u:1:1"]


def test_missing_inputs_name_the_fix(tmp_path: Path) -> None:
    catalog, kf = make_inputs(tmp_path, {"v1": 1}, [("u:1", "v1")])
    with pytest.raises(FileNotFoundError, match="keyframes stage"):
        run_perception(catalog, tmp_path / "nowhere", tmp_path / "out", PerceptionConfig())
    with pytest.raises(FileNotFoundError, match="preprocess"):
        run_perception(tmp_path / "no.parquet", kf, tmp_path / "out", PerceptionConfig())


RUNNER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from embodied_r.backends.base import BackendConfig
    from embodied_r.perception.stage import run_perception
    from embodied_r.perception.config import PerceptionConfig

    catalog, kf, out, model, mode = sys.argv[1:6]
    cfg = PerceptionConfig(
        backend=BackendConfig(kind="transformers", model=model, device="cpu", batch_size=1,
                              concurrency=1, max_pixels=56 * 56),
        max_new_tokens=12, question_max_new_tokens=24, mode=mode,
    )
    run_perception(Path(catalog), Path(kf), Path(out), cfg)
    """
)


def log_lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [line for line in path.read_text().split("\n")[:-1]]  # complete lines only


def expected_keys(mode: str, videos: dict[str, int], questions: list[tuple[str, str]]) -> set[str]:
    if mode == "per_question":
        return {f"{uid}:{f}" for uid, v in questions for f in range(videos[v])}
    used = {v for _, v in questions}
    return {f"video:{v}:{f}" for v in used for f in range(videos[v])} | {
        f"question:{uid}:0" for uid, _ in questions
    }


@pytest.mark.parametrize("mode", ["per_question", "per_video"])
def test_kill_and_resume(tiny_vlm_path: Path, tmp_path: Path, mode: str) -> None:
    videos = {"a": 4, "b": 3}
    questions = [(f"q:{i}", "a" if i % 2 else "b") for i in range(8)]
    catalog, kf = make_inputs(tmp_path, videos, questions)
    keys_needed = expected_keys(mode, videos, questions)
    total = len(keys_needed)
    out = tmp_path / "perception"
    log = tmp_path / "perception.partial" / "items.jsonl"
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    # Killed past half way (in per_video mode, inside the question passes); one call at a
    # time, so exactly that many calls are logged.
    threshold = total // 2 + 1
    kill_at_item([sys.executable, str(script), str(catalog), str(kf), str(out), str(tiny_vlm_path), mode],
                 "perception", threshold, tmp_path, env={"OMP_NUM_THREADS": "1"})
    before = [json.loads(line) for line in log_lines(log)]
    assert len(before) == threshold and not out.exists()

    cfg = tiny_cfg(tiny_vlm_path, batch_size=1, mode=mode)
    summary = run_perception(catalog, kf, out, cfg)
    assert summary["done"] == 8 and summary["failed"] == 0
    # The resumed run made exactly the calls the killed one had not finished ...
    assert summary["calls_made"] == total - len(before)
    keys = [json.loads(line)["key"] for line in log_lines(out / "items.jsonl")]
    # ... so every call is logged exactly once, none repeated and none lost.
    assert Counter(keys).most_common(1)[0][1] == 1
    assert set(keys) == keys_needed
    # And the result equals an uninterrupted run's.
    fresh = run_perception(catalog, kf, tmp_path / "fresh", cfg)
    assert fresh["calls_made"] == fresh["calls"] == total
    assert summary["calls"] == total and summary["prompt_tokens"] == fresh["prompt_tokens"]
    texts = lambda p: {r["uid"]: r["video_text"] for r in pq.read_table(p / "perception.parquet").to_pylist()}
    assert texts(out) == texts(tmp_path / "fresh")
