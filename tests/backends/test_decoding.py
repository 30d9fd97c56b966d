"""Repetition penalty and top-k: a number, or "generation_config" (the model's own), resolved
where the model is loaded (transformers, vLLM) or left to the server (OpenAI-compatible, which
then uses the model's generation config); recorded in the stage keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from embodied_r.backends.base import BackendConfig, decoding
from embodied_r.backends.hf_local import TransformersBackend
from embodied_r.backends.openai_compat import OpenAIBackend
from embodied_r.backends.vllm_engine import model_generation_config
from embodied_r.config import load_recipe
from embodied_r.pipeline import plan
from tests.servers import ChatStub, StubReply, completion


def test_values_and_their_resolution() -> None:
    qwen = {"repetition_penalty": 1.05, "top_k": 1, "top_p": 0.001}
    assert decoding(BackendConfig(repetition_penalty="generation_config", top_k="generation_config"), qwen) == {
        "repetition_penalty": 1.05, "top_k": 1}
    assert decoding(BackendConfig(repetition_penalty=1.1, top_k=10), qwen) == {"repetition_penalty": 1.1, "top_k": 10}
    # Unset here, or absent from the model's config: nothing is forced.
    assert decoding(BackendConfig(), qwen) == {}
    assert decoding(BackendConfig(repetition_penalty="generation_config"), {}) == {}
    for bad in ({"repetition_penalty": 0}, {"top_k": -1}, {"repetition_penalty": "model"}, {"top_k": 1.5}):
        with pytest.raises(ValidationError):
            BackendConfig(**bad)


def test_openai_sends_numbers_and_leaves_generation_config_to_the_server() -> None:
    server = ChatStub(lambda body: StubReply(payload=completion(body["model"], "ok", 1, 1)))
    try:
        for rp, k in ((1.1, 10), ("generation_config", "generation_config"), (None, None)):
            cfg = BackendConfig(kind="openai", model="m", base_url=server.base_url, api_key_env="EMBODIED_R_TEST_NO_KEY",
                                temperature=0.6, repetition_penalty=rp, top_k=k, max_retries=0)
            backend = OpenAIBackend(cfg)
            assert backend.generate([[{"role": "user", "content": "hi"}]])[0].error is None
            backend.close()
    finally:
        server.stop()
    sent = [(b.get("repetition_penalty"), b.get("top_k")) for b in server.bodies]
    assert sent == [(1.1, 10), (None, None), (None, None)]
    assert "repetition_penalty" not in server.bodies[1] and "top_k" not in server.bodies[1]


def test_transformers_takes_the_models_generation_config(tiny_lm_path: Path, tmp_path: Path) -> None:
    model = tmp_path / "lm"
    shutil.copytree(tiny_lm_path, model)
    config = json.loads((model / "generation_config.json").read_text())
    # Below 1 a penalty favours tokens already seen: a random model's output then visibly changes.
    (model / "generation_config.json").write_text(json.dumps({**config, "repetition_penalty": 0.05, "top_k": 7}))
    conv = [[{"role": "user", "content": "hello hello hello"}]]

    def run(**kw: object) -> tuple[dict[str, object], str]:
        backend = TransformersBackend(BackendConfig(model=str(model), device="cpu", max_new_tokens=24, **kw))
        try:
            return backend.decoding, backend.generate(conv)[0].text
        finally:
            backend.close()

    resolved, penalised = run(repetition_penalty="generation_config", top_k="generation_config")
    assert resolved == {"repetition_penalty": 0.05, "top_k": 7}
    assert run(repetition_penalty=0.05) == ({"repetition_penalty": 0.05}, penalised)
    none, plain = run(repetition_penalty=1.0)
    assert none == {"repetition_penalty": 1.0} and plain != penalised  # the penalty reached generate


def test_vllm_reads_the_model_folders_generation_config(tmp_path: Path) -> None:
    assert model_generation_config(str(tmp_path)) == {}
    (tmp_path / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.05, "top_k": 1}))
    assert decoding(BackendConfig(repetition_penalty="generation_config"), model_generation_config(str(tmp_path))) == {
        "repetition_penalty": 1.05}


def test_decoding_is_in_the_stage_keys(tmp_path: Path) -> None:
    base = plan(load_recipe("paper"), tmp_path)
    for section, stage in (("perception", "perception"), ("evaluation", "evaluate")):
        other = plan(load_recipe("paper", {section: {"backend": {"repetition_penalty": 1.0}}}), tmp_path)
        assert other[stage].key != base[stage].key and other["keyframes"].key == base["keyframes"].key
    other = plan(load_recipe("paper", {"training": {"reference": {"top_k": 5}}}), tmp_path)
    assert other["train_stage1"].key != base["train_stage1"].key and other["convert"].key == base["convert"].key
