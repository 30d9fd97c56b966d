"""Operational settings (limits, timeouts, retries, concurrency, servers, workers) never move
a stage's folder: raising a limit or pointing at another server resumes the same ``.partial``
and sends only the missing calls. Settings that change results still do move it.

Real HTTP servers on 127.0.0.1 count the calls; the stage runs through the pipeline's plan.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from embodied_r.config import load_recipe
from embodied_r.errors import TooManyFailures
from embodied_r.pipeline import StagePlan, execute, plan
from tests.perception.test_perception import make_inputs
from tests.perception.test_perception_http import RecordingServer


def _perception(home: Path, url: str, inputs: dict[str, str], **perception: Any) -> StagePlan:
    backend = {"kind": "openai", "model": "vlm", "base_url": url, "api_key_env": "EMBODIED_R_TEST_NO_KEY",
               "max_retries": 0, "timeout_s": 5.0, "concurrency": 4, "max_pixels": 64 * 64}
    backend.update(perception.pop("backend", {}))
    recipe = load_recipe("smoke", {"perception": {"backend": backend, "max_new_tokens": 64, **perception}})
    return dataclasses.replace(plan(recipe, home)["perception"], inputs=inputs)


def _refusing_video_b(body: dict[str, Any]) -> tuple[int, str] | None:
    # q:3 is the only question about video b: refused as bad input, so it fails alone.
    return (400, "this image cannot be read") if "seen in b?" in json.dumps(body) else None


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    return {"catalog": str(catalog), "keyframes": str(kf)}


def _first_run_fails(home: Path, srv: RecordingServer, inputs: dict[str, str]) -> StagePlan:
    sp = _perception(home, srv.base_url, inputs)
    with pytest.raises(TooManyFailures, match="max_failed_fraction"):
        execute(sp)
    # q:1 and q:2: three calls each; q:3: two calls, both refused.
    assert len(srv.bodies) == 8 and Path(sp.out + ".partial").is_dir()
    return sp


def test_another_server_and_other_limits_resume_the_same_folder(tmp_path: Path, inputs: dict[str, str]) -> None:
    home = tmp_path / "home"
    first, second = RecordingServer(fault=_refusing_video_b), RecordingServer()
    try:
        sp = _first_run_fails(home, first, inputs)
        moved = _perception(home, second.base_url, inputs,
                            backend={"timeout_s": 9.0, "concurrency": 1, "max_retries": 2,
                                     "api_key_env": "EMBODIED_R_OTHER_KEY"})
        assert moved.out == sp.out
        summary = execute(moved)
    finally:
        first.stop()
        second.stop()
    assert summary["done"] == 3 and summary["failed"] == 0
    assert len(first.bodies) == 8 and len(second.bodies) == 2  # only q:3's two calls
    assert not Path(sp.out + ".partial").exists()


def test_raising_the_failure_limit_sends_only_the_missing_calls(tmp_path: Path, inputs: dict[str, str]) -> None:
    home = tmp_path / "home"
    srv = RecordingServer(fault=_refusing_video_b)
    try:
        sp = _first_run_fails(home, srv, inputs)
        raised = _perception(home, srv.base_url, inputs, max_failed_fraction=0.5)
        assert raised.out == sp.out
        summary = execute(raised)
        assert summary["done"] == 2 and summary["failed"] == 1
        assert len(srv.bodies) == 10  # q:3's two calls, tried again; nothing finished was redone
        again = _perception(home, srv.base_url, inputs, max_failed_fraction=0.4, backend={"timeout_s": 30.0})
        assert again.out == sp.out and execute(again) == summary
        assert len(srv.bodies) == 10
    finally:
        srv.stop()


def _keys(overrides: dict[str, Any]) -> dict[str, str]:
    return {name: sp.key for name, sp in plan(load_recipe("smoke", overrides), Path("/nowhere")).items()}


@pytest.mark.parametrize("operational, result", [
    ({"perception": {"max_failed_fraction": 0.9}}, {"perception": {"max_new_tokens": 99}}),
    ({"perception": {"backend": {"base_url": "http://127.0.0.1:1/v1", "timeout_s": 1.0, "concurrency": 64,
                                 "max_retries": 0, "batch_size": 2, "api_key_env": "OTHER"}}},
     {"perception": {"backend": {"temperature": 0.7}}}),
    ({"perception": {"backend": {"timeout_s": 1.0}}}, {"perception": {"backend": {"model": "tiny:other"}}}),
    ({"perception": {"backend": {"concurrency": 2}}}, {"perception": {"backend": {"top_p": 0.5}}}),
    ({"perception": {"max_failed_fraction": 0.2}}, {"perception": {"question_label": "Question-related:"}}),
    ({"perception": {"max_failed_fraction": 0.2}}, {"perception": {"reply_format": "json"}}),
    ({"keyframes": {"workers": 1, "cv_threads": 1, "decode_threads": 1, "decode_ahead": 0, "cache": False}},
     {"keyframes": {"max_frames": 9}}),
    ({"evaluation": {"max_failed_fraction": 0.5, "chunk_size": 4, "backend": {"timeout_s": 5.0}}},
     {"evaluation": {"backend": {"max_new_tokens": 9}}}),
    ({"training": {"python": "/usr/bin/python3", "save_steps": 1, "save_total_limit": 5, "logging_steps": 9,
                   "completion_table_steps": 3, "reference": {"concurrency": 1, "timeout_s": 9.0}}},
     {"training": {"repetition_penalty": 1.1}}),
    ({"training": {"reference": {"base_url": "http://127.0.0.1:2/v1"}}},
     {"training": {"reference": {"max_new_tokens": 9}}}),
])
def test_operational_settings_keep_every_key(operational: dict[str, Any], result: dict[str, Any]) -> None:
    """An operational setting moves no stage; a result setting beside it moves its stage and
    every stage after it."""
    before = _keys({})
    assert _keys(operational) == before
    moved = [name for name, key in _keys(result).items() if key != before[name]]
    first = {"perception": "perception", "keyframes": "keyframes", "evaluation": "evaluate",
             "training": "train_stage1"}[next(iter(result))]
    assert first in moved and "preprocess" not in moved
