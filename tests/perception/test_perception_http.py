"""Perception over HTTP against a recording OpenAI-compatible server on 127.0.0.1: the
exact request bodies (images, structured output), the fallback when a server refuses
``response_format``, and the stage end to end with faults."""

from __future__ import annotations

import base64
import io
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from embodied_r.perception import prompts
from embodied_r.backends.images import image_data_url
from embodied_r.backends.openai_compat import OpenAIBackend
from embodied_r.backends.base import BackendConfig
from embodied_r.perception.stage import run_perception
from embodied_r.perception.config import PerceptionConfig
from tests.perception.test_perception import make_inputs
from tests.servers import ChatStub, StubReply, completion

Fault = Callable[[dict[str, Any]], tuple[int, str] | None]
# The `improved` recipe's form of the requests: JSON replies, images first, a system message.
JSON_FORM = {"reply_format": "json", "image_order": "images_first", "system_message": True,
             "question_label": "Question-related:"}


def reply_for(body: dict[str, Any]) -> str:
    """A reply a perceiver could give: JSON valid for the requested schema, else
    labelled plain text shaped by the instruction."""
    fmt = body.get("response_format")
    if fmt:
        schema = fmt["json_schema"]["schema"]
        return json.dumps(
            {k: (v["enum"][-1] if "enum" in v else f"{k} seen") for k, v in schema["properties"].items()}
        )
    content = body["messages"][-1]["content"]
    text = content if isinstance(content, str) else next(p["text"] for p in content if p["type"] == "text")
    frames = re.findall(r'"frame_(\d+)"', text) or re.findall(r"key frames (\d+) to (\d+)", text)
    if frames and isinstance(frames[0], tuple):
        frames = [str(f) for f in range(int(frames[0][0]), int(frames[0][1]) + 1)]
    if frames:
        return "\n".join(f"Frame {f}: object {f} on the left" for f in frames)
    if "three numbered points" in text:
        return "1. Rotate right.\n2. A grey corridor to the front-left.\n3. The door, ahead."
    if "two numbered points" in text:
        return "### 1. **Action:** rotate right\n### 2. **New information:** a grey corridor"
    if "Describe the scene" in text and "JSON" not in text:
        return "A grey hall; a red door ahead."  # a first frame in the official form: prose
    lines = ["New information: a corridor"]
    if "Which one movement" in text:
        lines.insert(0, "Action: turned right")
    if "Question:" in text:
        lines.append("Question-related objects: the door")
    return "\n".join(lines)


class RecordingServer(ChatStub):
    """Answers ``/v1/chat/completions``, records every body, and lets a test refuse
    ``response_format`` or inject a fault per request."""

    def __init__(self, refuse_structured: bool = False, fault: Fault | None = None):
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self.refuse_structured = refuse_structured
        self.fault = fault
        super().__init__(self._answer)

    def _answer(self, body: dict[str, Any]) -> StubReply:
        injected = self.fault(body) if self.fault else None
        if self.refuse_structured and "response_format" in body:
            return StubReply(400, {"error": {"message": "response_format is not supported"}}, {"Retry-After": "0"})
        if injected:
            return StubReply(injected[0], {"error": {"message": injected[1]}}, {"Retry-After": "0"})
        text = reply_for(body)
        usage = {"prompt_tokens": len(json.dumps(body["messages"])) // 100 + 1,
                 "completion_tokens": len(text) // 4 + 1}
        with self.lock:
            for key in self.usage:
                self.usage[key] += usage[key]
        return StubReply(payload=completion(body["model"], text, usage["prompt_tokens"], usage["completion_tokens"]),
                         headers={"Retry-After": "0"})


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    srv = RecordingServer()
    yield srv
    srv.stop()


@pytest.fixture
def refusing() -> Iterator[RecordingServer]:
    srv = RecordingServer(refuse_structured=True)
    yield srv
    srv.stop()


def backend_for(srv: RecordingServer, **kw: Any) -> OpenAIBackend:
    cfg = BackendConfig(kind="openai", model="vlm", base_url=srv.base_url, api_key_env="EMBODIED_R_TEST_NO_KEY",
                        max_retries=2, timeout_s=5.0, **kw)
    return OpenAIBackend(cfg, backoff_base_s=0.01, backoff_max_s=0.02)


def decode(url: str) -> Image.Image:
    assert url.startswith("data:image/jpeg;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def test_image_request_body(server: RecordingServer, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate([(360, 640), (480, 360)]):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(paths[-1])
    style = prompts.PromptStyle("json", "images_first", True)
    conv = prompts.pair_conversation(str(paths[0]), str(paths[1]), "Where is the door?\nA. left\nB. right", style)
    backend = backend_for(server, max_pixels=128 * 128, max_new_tokens=77)
    gen = backend.generate([conv], schemas=[prompts.PAIR_SCHEMA])[0]
    backend.close()
    assert gen.error is None and json.loads(gen.text)["action"] == prompts.ACTIONS[-1]

    (body,) = server.bodies
    content = body["messages"][1]["content"]
    images = [decode(part["image_url"]["url"]) for part in content[:2]]
    # Images come first, as JPEG data URLs scaled into the pixel budget with their shape
    # kept; the text with the question comes last.
    for img, (h, w) in zip(images, [(360, 640), (480, 360)]):
        assert img.format == "JPEG" and img.width * img.height <= 128 * 128
        assert img.width * img.height > 0.9 * 128 * 128 and abs(img.width / img.height - w / h) < 0.03
    placeholder = [{"type": "image_url", "image_url": {"url": "<jpeg>"}}] * 2
    body["messages"][1]["content"] = placeholder + content[2:]
    assert body == {
        "model": "vlm",
        "messages": [
            {"role": "system", "content": prompts.SYSTEM},
            {"role": "user", "content": placeholder + [
                {"type": "text", "text": prompts.pair_instruction("json")
                 + "\n\nQuestion: Where is the door?\nA. left\nB. right"}]},
        ],
        "max_tokens": 77,
        "temperature": 0.0,
        "top_p": 1.0,
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "frame_pair", "strict": True,
            "schema": {k: v for k, v in prompts.PAIR_SCHEMA.items() if k != "title"}}},
    }


def test_png_nearest_sends_a_lossless_nearest_neighbour_shrink(server: RecordingServer, tmp_path: Path) -> None:
    # A black-and-white checkerboard of 3-pixel squares: a nearest-neighbour shrink keeps only
    # black and white, a bilinear (antialiased) one or a JPEG brings greys.
    board = ((np.indices((300, 300)).sum(axis=0) // 3) % 2 * 255).astype(np.uint8)
    Image.fromarray(np.stack([board] * 3, axis=-1)).save(tmp_path / "board.png")
    conv = [{"role": "user", "content": [{"type": "image", "path": str(tmp_path / "board.png")},
                                         {"type": "text", "text": "what is it?"}]}]
    for encoding in ("png-nearest", "jpeg-bilinear"):
        backend = backend_for(server, max_pixels=100 * 100, image_encoding=encoding)
        assert backend.generate([conv])[0].error is None
        backend.close()
    nearest, bilinear = (body["messages"][0]["content"][0]["image_url"]["url"] for body in server.bodies)
    assert nearest.startswith("data:image/png;base64,") and bilinear.startswith("data:image/jpeg;base64,")
    pixels = [set(np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))).ravel().tolist())
              for url in (nearest, bilinear)]
    assert pixels[0] == {0, 255} and len(pixels[1]) > 2


def test_key_frames_are_encoded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from embodied_r.backends import images as backend_images

    path = tmp_path / "f.jpg"
    Image.fromarray(np.full((90, 160, 3), 40, dtype=np.uint8)).save(path)
    encoded: list[str] = []
    real = backend_images.encode_image
    monkeypatch.setattr(backend_images, "encode_image", lambda p, m, e: encoded.append(p) or real(p, m, e))
    cache = backend_images.ImageCache(size=2)
    with ThreadPoolExecutor(8) as pool:
        urls = set(pool.map(lambda _: cache.get(str(path), 50 * 50), range(32)))
    assert len(urls) == 1 and encoded == [str(path)]  # 32 calls at once, one encoding
    assert decode(urls.pop()).size == (66, 37)
    before = path.stat().st_mtime_ns
    Image.fromarray(np.full((90, 160, 3), 200, dtype=np.uint8)).save(path)  # rewritten in place
    os.utime(path, ns=(before + 10**9, before + 10**9))  # whatever the file system's clock grain
    assert decode(cache.get(str(path), 50 * 50)).getpixel((5, 5))[0] > 150 and len(encoded) == 2
    with pytest.raises(FileNotFoundError):
        cache.get(str(tmp_path / "gone.jpg"), 100)


def test_refused_structured_output_falls_back_to_text(refusing: RecordingServer) -> None:
    backend = backend_for(refusing, concurrency=1)
    convs = [[{"role": "user", "content": f"q{i}"}] for i in range(3)]
    out = backend.generate(convs, schemas=[prompts.SCENE_SCHEMA, None, prompts.SCENE_SCHEMA])
    backend.close()
    assert all(g.error is None for g in out) and out[0].text == "New information: a corridor"
    # One refused request, then every call goes without the field; no retry is spent.
    assert ["response_format" in b for b in refusing.bodies] == [True, False, False, False]
    assert backend.structured_output_refused and backend.retry_log == []


def test_other_client_errors_do_not_drop_structured_output() -> None:
    srv = RecordingServer(fault=lambda body: (400, "prompt is too long"))
    try:
        backend = backend_for(srv)
        gen = backend.generate([[{"role": "user", "content": "q"}]], schemas=[prompts.SCENE_SCHEMA])[0]
        backend.close()
    finally:
        srv.stop()
    assert gen.error and "too long" in gen.error and len(srv.bodies) == 1
    assert not backend.structured_output_refused


def test_on_result_reports_each_call_once(server: RecordingServer) -> None:
    backend = backend_for(server, concurrency=4)
    seen: list[int] = []
    convs = [[{"role": "user", "content": f"q{i}"}] for i in range(9)]
    out = backend.generate(convs, on_result=lambda i, g: seen.append(i), max_new_tokens=5)
    backend.close()
    assert sorted(seen) == list(range(9)) and all(g.error is None for g in out)
    assert {b["max_tokens"] for b in server.bodies} == {5}


def stage_cfg(srv: RecordingServer, mode: str, **kw: Any) -> PerceptionConfig:
    backend = BackendConfig(kind="openai", model="vlm", base_url=srv.base_url, api_key_env="EMBODIED_R_TEST_NO_KEY",
                            max_retries=2, timeout_s=5.0, concurrency=4, max_pixels=64 * 64)
    return PerceptionConfig(backend=backend, mode=mode, max_new_tokens=64, **kw)


@pytest.mark.parametrize("mode", ["per_question", "per_video"])
def test_stage_over_http_with_structured_output(server: RecordingServer, tmp_path: Path, mode: str) -> None:
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    summary = run_perception(catalog, kf, tmp_path / "out", stage_cfg(server, mode, **JSON_FORM))
    assert summary["done"] == 3 and summary["failed"] == 0 and summary["structured_output_refused"] == 0
    # per_question: 3 + 3 + 2 calls; per_video: 3 + 2 video calls and 3 question passes.
    assert summary["calls_made"] == summary["calls"] == len(server.bodies) == 8
    assert all("response_format" in b for b in server.bodies)
    assert summary["prompt_tokens"] == server.usage["prompt_tokens"]
    assert summary["completion_tokens"] == server.usage["completion_tokens"]
    assert summary["parsed_as"] == {"json": 8}
    frames = pq.read_table(tmp_path / "out" / "perception_frames.parquet").to_pylist()
    assert {r["action"] for r in frames if r["frame"] > 0} == {prompts.ACTIONS[-1]}
    related = {r["question_info"] for r in frames}
    assert related == ({"question_info seen"} if mode == "per_question" else {f"frame_{i} seen" for i in range(3)})


def test_stage_over_http_plain_text_and_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBODIED_R_TEST_NO_KEY", "sk-secret-perception")
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    # Every request showing b's last key frame is refused as bad input (an item's fault,
    # not an outage: the stage goes on); nothing else is.
    wanted = image_data_url(str(kf / "frames/b/001.jpg"), 64 * 64)
    srv = RecordingServer(refuse_structured=True,
                          fault=lambda body: (400, "image exceeds the size limit") if wanted in json.dumps(body)
                          else None)
    cfg = stage_cfg(srv, "per_video", **JSON_FORM).model_copy(update={"max_failed_fraction": 0.5})
    try:
        summary = run_perception(catalog, kf, tmp_path / "out", cfg)
    finally:
        srv.stop()
    assert summary["structured_output_refused"] == 1 and summary["parsed_as"] == {"labels": 6}
    assert summary["done"] == 2 and summary["failed"] == 1 and summary["reasons"] == {"call_failed": 1}
    # b's pair call is refused (not retried: a 400); q:3's question pass is then not sent.
    assert summary["calls_failed"] == 1 and summary["calls_skipped"] == 1 and summary["retries"] == 0
    assert summary["calls_made"] == 5 + 2 and summary["calls"] == 4 + 2
    fails = pq.read_table(tmp_path / "out" / "failures.parquet").to_pylist()
    assert [f["item"] for f in fails] == ["q:3"]
    assert fails[0]["reason"].startswith("call video:b:1 failed") and "size limit" in fails[0]["reason"]
    text = {r["uid"]: r["video_text"] for r in pq.read_table(tmp_path / "out" / "perception.parquet").to_pylist()}
    assert set(text) == {"q:1", "q:2"}
    assert text["q:1"].split("\n")[1] == (
        "Frame 1: After rotate right, Observe: a corridor Question-related: object 1 on the left"
    )

    # What the flow logs to MLflow for the stage: calls, failures, retries and tokens as
    # metrics, in a real SQLite store; the key stays out of params and artifacts.
    from mlflow import MlflowClient

    from embodied_r.tracking.runs import Tracker, record_stage

    tracker = Tracker.open("perception-test", f"sqlite:///{tmp_path / 'mlflow.db'}", root=tmp_path)
    run_id = tracker.start_stage("perception", cfg.model_dump(mode="json"))
    record_stage(tracker, run_id, tmp_path / "out", summary)
    run = MlflowClient(tracker.uri).get_run(run_id)
    assert {k: run.data.metrics[f"summary/{k}"] for k in ("calls", "calls_made", "calls_failed", "retries", "failed")} == {
        "calls": 6, "calls_made": 7, "calls_failed": 1, "retries": 0, "failed": 1}
    assert run.data.metrics["summary/prompt_tokens"] == summary["prompt_tokens"] > 0
    assert run.data.metrics["summary/completion_tokens"] == summary["completion_tokens"] > 0
    assert run.data.metrics["summary/calls_by_kind/question"] == 2 and run.data.metrics["summary/structured_output_refused"] == 1
    assert run.data.params["backend.api_key_env"] == "EMBODIED_R_TEST_NO_KEY"
    logged = json.dumps(run.data.params) + (tmp_path / "out" / "summary.json").read_text()
    assert "sk-secret-perception" not in logged


@pytest.mark.parametrize("mode", ["per_question", "per_video"])
def test_stage_over_http_in_the_official_form(server: RecordingServer, tmp_path: Path, mode: str) -> None:
    """The `paper` recipe's requests: the text before the images, no system message, no
    schema, full-size JPEG key frames sent as they are; numbered replies read point by point."""
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    cfg = stage_cfg(server, mode).model_copy(update={"backend": stage_cfg(server, mode).backend.model_copy(
        update={"max_pixels": 16384 * 28 * 28})})
    summary = run_perception(catalog, kf, tmp_path / "out", cfg)
    assert summary["done"] == 3 and summary["reply_format"] == "numbered"
    assert not any("response_format" in b for b in server.bodies)
    for body in server.bodies:
        assert [m["role"] for m in body["messages"]] == ["user"]
        parts = body["messages"][0]["content"]
        assert parts[0]["type"] == "text" and {p["type"] for p in parts[1:]} == {"image_url"}
    sent = server.bodies[-1]["messages"][0]["content"][1]["image_url"]["url"]
    assert base64.b64decode(sent.split(",", 1)[1]) in {p.read_bytes() for p in kf.rglob("*.jpg")}
    text = {r["uid"]: r["video_text"] for r in pq.read_table(tmp_path / "out" / "perception.parquet").to_pylist()}
    if mode == "per_question":
        assert summary["parsed_as"] == {"text": 3, "numbered": 5}
        assert text["q:1"].split("\n") == [
            "Frame 0: Observe: A grey hall; a red door ahead.",
            "Frame 1: After rotate right, Observe: A grey corridor to the front-left. The door, ahead.",
            "Frame 2: After rotate right, Observe: A grey corridor to the front-left. The door, ahead.",
        ]
    else:
        assert summary["parsed_as"] == {"text": 3, "numbered": 5}
        assert text["q:1"].split("\n")[1] == "Frame 1: After rotate right, Observe: a grey corridor object 1 on the left"
