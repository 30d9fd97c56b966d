"""Replies that are no result: empty or null content, no action in any reply, replies far
past the token budget; and prompts longer than training allows at evaluation.

Fake OpenAI-compatible servers on 127.0.0.1 give the replies real servers give when they
are misconfigured (a reasoning parser that moves the text out of ``content``, a model that
ignores ``max_tokens``); the stages run for real against them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from embodied_r.backends.base import BackendConfig
from embodied_r.backends.openai_compat import OpenAIBackend
from embodied_r.config import load_recipe
from embodied_r.errors import StageFault, TooManyFailures
from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.evaluation.stage import run_evaluation
from embodied_r.perception.stage import run_perception
from embodied_r.pipeline import plan
from tests.servers import ChatStub, StubReply, completion
from tests.perception.test_perception import make_inputs
from tests.perception.test_perception_http import reply_for, stage_cfg
from tests.stage_inputs import VIDEO, build_records, catalog_row

CONVERSATION = [{"role": "user", "content": "hi"}]


def _empty(content: str | None) -> dict[str, Any]:
    body = completion("m", "x")
    body["choices"][0]["message"]["content"] = content
    return body


def _backend(url: str, retries: int) -> OpenAIBackend:
    cfg = BackendConfig(kind="openai", model="m", base_url=url, timeout_s=10.0, max_retries=retries,
                        api_key_env="EMBODIED_R_TEST_NO_KEY")
    return OpenAIBackend(cfg, backoff_base_s=0.01, backoff_max_s=0.02)


@pytest.mark.parametrize("content", ["", None, "  \n"], ids=["empty", "null", "blank"])
def test_an_empty_reply_is_a_failed_call_and_is_retried(content: str | None) -> None:
    empty_once = ChatStub(lambda body: StubReply(payload=_empty(content) if len(empty_once.bodies) == 1
                                                 else completion("m", "a door ahead")))
    always = ChatStub(lambda body: StubReply(payload=_empty(content)))
    once, never = _backend(empty_once.base_url, 2), _backend(always.base_url, 2)
    try:
        recovered = once.generate([CONVERSATION])[0]
        failed = never.generate([CONVERSATION])[0]
    finally:
        for b in (once, never):
            b.close()
        empty_once.stop()
        always.stop()
    assert recovered.error is None and recovered.text == "a door ahead"
    assert [r for r, _ in once.retry_log] == ["empty_reply"]
    assert failed.text == "" and failed.error.startswith("empty_reply") and failed.error_kind == "item"
    assert len(always.bodies) == 3  # the first call and its two retries


def _perception(tmp_path: Path, reply: Any, **update: Any) -> tuple[Path, Path, Path, Any, ChatStub]:
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    stub = ChatStub(reply)
    cfg = stage_cfg(stub, "per_question")
    cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"max_retries": 1, **update})})
    return catalog, kf, tmp_path / "out", cfg, stub


def test_perception_whose_replies_are_all_empty_fails_naming_the_server(tmp_path: Path) -> None:
    catalog, kf, out, cfg, stub = _perception(tmp_path, lambda body: StubReply(payload=_empty(None)))
    try:
        with pytest.raises(TooManyFailures) as err:
            run_perception(catalog, kf, out, cfg)
    finally:
        stub.stop()
    message = str(err.value)
    assert "\n" not in message and stub.base_url in message and "empty_reply" in message
    assert "reasoning parser" in message
    assert not out.exists()
    reasons = pq.read_table(tmp_path / "out.partial" / "failures.parquet").column("reason").to_pylist()
    assert len(reasons) == 3 and all("empty_reply" in r for r in reasons)


def test_perception_whose_replies_name_no_action_fails_naming_the_server(tmp_path: Path) -> None:
    catalog, kf, out, cfg, stub = _perception(
        tmp_path, lambda body: StubReply(payload=completion("vlm", "I am a helpful assistant.")))
    try:
        with pytest.raises(StageFault) as err:
            run_perception(catalog, kf, out, cfg)
    finally:
        stub.stop()
    message = str(err.value)
    assert "\n" not in message and stub.base_url in message and "unknown_action_rate 1.0" in message
    assert "--refresh perception" in message
    assert not out.exists()


def test_replies_past_the_token_budget_are_cut_and_counted(tmp_path: Path) -> None:
    flood = " and more" * 25_000  # about 220 KB: a server that ignores max_tokens

    def reply(body: dict) -> StubReply:
        return StubReply(payload=completion("vlm", reply_for(body) + flood, completion_tokens=50_000))

    catalog, kf, out, cfg, stub = _perception(tmp_path, reply)
    try:
        summary = run_perception(catalog, kf, out, cfg)
    finally:
        stub.stop()
    assert summary["replies_truncated"] == summary["calls"] == 8
    from embodied_r.backends.openai_compat import MAX_CHARS_PER_TOKEN

    limit = cfg.max_new_tokens * MAX_CHARS_PER_TOKEN
    raws = pq.read_table(out / "perception_frames.parquet").column("raw").to_pylist()
    assert max(len(r) for r in raws) <= limit and summary["completion_tokens"] <= 8 * cfg.max_new_tokens
    assert summary["unknown_action_rate"] == 0.0  # the cut keeps the reply's beginning


# -- evaluation: prompts bounded as training bounds them, replies cut and counted -------

def _records(tmp_path: Path, long_uids: set[str]) -> Path:
    rows = [catalog_row(f"urbanvideo:{i}", "test", answer="ABCD"[i % 4]) for i in range(4)]
    texts = {r["uid"]: (VIDEO + " a red door ahead." * 400) if r["uid"] in long_uids else VIDEO for r in rows}
    return build_records(tmp_path, rows, texts)


def test_evaluation_cuts_long_prompts_as_training_does_and_counts_them(tiny_lm_path: Path, tmp_path: Path) -> None:
    records = _records(tmp_path, {"urbanvideo:1", "urbanvideo:2"})
    cfg = EvaluationConfig(backend=BackendConfig(kind="transformers", device="cpu", batch_size=4),
                           max_new_tokens=4, chunk_size=4, max_prompt_length=1024)
    summary = run_evaluation(records, str(tiny_lm_path), tmp_path / "eval", cfg)
    assert summary["prompts_truncated"] == 2 and summary["done"] == 4 and summary["failed"] == 0


def test_the_pipeline_bounds_evaluation_prompts_by_the_training_limit() -> None:
    recipe = load_recipe("paper")
    stages = plan(recipe)
    assert stages["evaluate"].config["max_prompt_length"] == recipe.training.max_prompt_length == 6144


def test_evaluation_counts_replies_cut_to_the_budget(tmp_path: Path) -> None:
    records = _records(tmp_path, set())
    stub = ChatStub(lambda body: StubReply(payload=completion("m", "<answer>A</answer>" + "x" * 200_000)))
    backend = BackendConfig(kind="openai", model="m", base_url=stub.base_url, timeout_s=10.0, max_retries=0,
                            api_key_env="EMBODIED_R_TEST_NO_KEY")
    try:
        summary = run_evaluation(records, "m", tmp_path / "eval", EvaluationConfig(backend=backend, max_new_tokens=32))
    finally:
        stub.stop()
    assert summary["replies_truncated"] == 4
    from embodied_r.backends.openai_compat import MAX_CHARS_PER_TOKEN

    completions = pq.read_table(tmp_path / "eval" / "predictions.parquet").column("completion").to_pylist()
    assert max(map(len, completions)) <= 32 * MAX_CHARS_PER_TOKEN
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["replies_truncated"] == 4
