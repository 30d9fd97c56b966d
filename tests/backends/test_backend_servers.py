"""Several OpenAI-compatible servers behind one backend (``base_urls``), against real
servers on 127.0.0.1: calls spread least busy first with the concurrency limit per server,
a closed server left out while the stage goes on, and a one-line error, with nothing
lost, when no server answers."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from embodied_r.backends.base import BackendConfig
from embodied_r.backends.openai_compat import OpenAIBackend
from embodied_r.errors import InfraFailure
from embodied_r.perception.stage import run_perception
from embodied_r.perception.config import PerceptionConfig
from embodied_r.settings import result_settings
from tests.perception.test_perception import make_inputs
from tests.perception.test_perception_http import RecordingServer
from tests.servers import ChatStub, StubReply, completion, free_port

KEY_ENV = "EMBODIED_R_TEST_SERVERS_KEY"


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: connection refused


def stage_cfg(urls: list[str], retries: int) -> PerceptionConfig:
    backend = BackendConfig(kind="openai", model="vlm", base_urls=urls, api_key_env=KEY_ENV,
                            max_retries=retries, timeout_s=10.0, concurrency=2, max_pixels=64 * 64)
    return PerceptionConfig(backend=backend, mode="per_question", max_new_tokens=64)


class Counting(ChatStub):
    """Answers after ``delay_s`` and records how many calls it held at once."""

    def __init__(self, delay_s: float):
        self.now = self.peak = 0
        self.delay_s = delay_s
        super().__init__(self._reply)

    def _reply(self, body: dict[str, Any]) -> StubReply:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(self.delay_s)
        with self.lock:
            self.now -= 1
        return StubReply(payload=completion(body["model"], "fine"))


def test_one_way_to_name_servers_and_pinning() -> None:
    with pytest.raises(ValidationError, match="not both"):
        BackendConfig(kind="openai", base_url="http://a/v1", base_urls=["http://b/v1"])
    with pytest.raises(ValidationError, match="more than once"):
        BackendConfig(kind="openai", base_urls=["http://a/v1", "http://a/v1/"])
    many = BackendConfig(kind="openai", model="m", base_urls=["http://a/v1", "http://b/v1", "http://c/v1"])
    assert [many.pin(i).urls() for i in range(4)] == [["http://a/v1"], ["http://b/v1"], ["http://c/v1"],
                                                      ["http://a/v1"]]
    # Which servers answer is operational: the stage key, and so the folder, stays the same.
    one = BackendConfig(kind="openai", model="m", base_url="http://a/v1")
    assert result_settings(many) == result_settings(one) == result_settings(many.pin(1))
    assert BackendConfig(kind="openai", model="m", base_urls=["http://a/v1"]).unready() is None


def test_calls_spread_least_busy_first_with_the_limit_per_server() -> None:
    servers = [Counting(0.3), Counting(0.3)]
    cfg = BackendConfig(kind="openai", model="m", base_urls=[s.base_url for s in servers],
                        api_key_env=KEY_ENV, concurrency=2, max_retries=0, timeout_s=10.0)
    backend = OpenAIBackend(cfg)
    try:
        out = backend.generate([[{"role": "user", "content": f"q{i}"}] for i in range(8)])
        # Calls one at a time alternate, rather than all going to the first server.
        for i in range(4):
            backend.generate([[{"role": "user", "content": f"alone {i}"}]])
    finally:
        backend.close()
        for s in servers:
            s.stop()
    assert all(g.error is None for g in out)
    # Two in flight on each server at most, and both servers busy at once.
    assert [s.peak for s in servers] == [2, 2]
    assert [len(s.bodies) for s in servers] == [6, 6]


def test_a_closed_server_is_left_out_and_the_stage_completes(tmp_path: Path) -> None:
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    live, dead = RecordingServer(), closed_url()
    # No retries: a call refused by the closed server must go on to the live one by itself.
    try:
        summary = run_perception(catalog, kf, tmp_path / "out", stage_cfg([dead, live.base_url], retries=0))
    finally:
        live.stop()
    assert summary["done"] == 3 and summary["failed"] == 0 and summary["calls_failed"] == 0
    assert len(live.bodies) == summary["calls"] == 8
    # The calls first sent to the closed server (two in flight there), each re-sent once.
    assert 1 <= summary["retries"] <= 2
    rows = pq.read_table(tmp_path / "out" / "perception.parquet").to_pylist()
    assert sorted(r["uid"] for r in rows) == ["q:1", "q:2", "q:3"]


def test_no_server_answers_one_line_and_nothing_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-secret-servers")
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    # One server answers video a's calls and fails video b's (HTTP 503); the other is closed.
    flaky = RecordingServer(fault=lambda body: (503, "overloaded") if "seen in b" in json.dumps(body) else None)
    dead = closed_url()
    try:
        with pytest.raises(InfraFailure) as info:
            run_perception(catalog, kf, tmp_path / "out", stage_cfg([flaky.base_url, dead], retries=0))
    finally:
        flaky.stop()
    message = str(info.value)
    assert "\n" not in message and flaky.base_url in message and dead in message
    assert "sk-secret-servers" not in message
    answered = sum("seen in b" not in json.dumps(b) for b in flaky.bodies)
    assert answered >= 1

    # The rerun sends only what did not finish: every answered call was kept.
    healthy = RecordingServer()
    try:
        summary = run_perception(catalog, kf, tmp_path / "out", stage_cfg([healthy.base_url, closed_url()], 0))
    finally:
        healthy.stop()
    assert summary["done"] == 3 and summary["failed"] == 0
    assert len(healthy.bodies) == 8 - answered


def test_last_server_keeps_its_retries(tmp_path: Path) -> None:
    """The last server in the rotation is never left out: a blip there is retried as with
    one server, and the batch after it tries the closed server again."""
    state = {"n": 0}
    lock = threading.Lock()

    def blip(body: dict[str, Any]) -> StubReply:
        with lock:
            state["n"] += 1
            first = state["n"] == 1
        if first:
            return StubReply(503, {"error": {"message": "warming up"}}, {"Retry-After": "0"})
        return StubReply(payload=completion(body["model"], "fine"))

    stub, dead = ChatStub(blip), closed_url()
    cfg = BackendConfig(kind="openai", model="m", base_urls=[dead, stub.base_url], api_key_env=KEY_ENV,
                        concurrency=1, max_retries=1, timeout_s=10.0)
    backend = OpenAIBackend(cfg, backoff_base_s=0.01, backoff_max_s=0.02)
    try:
        first = backend.generate([[{"role": "user", "content": "one"}]])
        second = backend.generate([[{"role": "user", "content": "two"}]])
    finally:
        backend.close()
        stub.stop()
    assert first[0].error is None and second[0].error is None
    reasons = [r for r, _ in backend.retry_log]
    # Batch one: refused by the closed server (sent elsewhere), then the 503 retried.
    # Batch two: the closed server is tried afresh and left out again.
    assert reasons[0].startswith("connection at " + dead) and reasons[1] == "http 503"
    assert reasons[2].startswith("connection at " + dead) and len(reasons) == 3


def test_every_server_closed_fails_each_call_naming_them_all() -> None:
    dead = [closed_url(), closed_url()]
    cfg = BackendConfig(kind="openai", model="m", base_urls=dead, api_key_env=KEY_ENV, max_retries=0, timeout_s=5.0)
    backend = OpenAIBackend(cfg)
    try:
        out = backend.generate([[{"role": "user", "content": "one"}], [{"role": "user", "content": "two"}]])
    finally:
        backend.close()
    assert all(g.infra_failed for g in out)
    first = next(g.error for g in out if not g.error.startswith("not sent"))
    assert first.startswith("no server answers: ") and "\n" not in first
    assert all(url in first for url in dead) and "ClientConnectorError" in first
