"""The vLLM backend: a clear error where vLLM is not installed, the messages it builds,
and (GPU and vLLM only) a real run on a small VLM."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from embodied_r.perception import prompts
from embodied_r.backends.vllm_engine import INSTALL_HINT, engine_kwargs, to_vllm_messages
from embodied_r.backends.base import BackendConfig
from embodied_r.errors import BackendUnavailable
from embodied_r.backends.factory import make_backend

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(2):
        paths.append(folder / f"{i}.jpg")
        Image.fromarray(rng.integers(0, 255, (360, 640, 3), dtype=np.uint8)).save(paths[-1])
    return paths


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_missing_vllm_says_what_to_install() -> None:
    with pytest.raises(BackendUnavailable) as err:
        make_backend(BackendConfig(kind="vllm", model="Qwen/Qwen2.5-VL-72B-Instruct"))
    assert str(err.value) == INSTALL_HINT
    assert "pip install --no-deps -e ." in INSTALL_HINT and "kind 'openai'" in INSTALL_HINT


def test_messages_carry_frames_in_place(frames: list[Path]) -> None:
    official = prompts.pair_conversation(str(frames[0]), str(frames[1]), "Where is the door?")
    parts = to_vllm_messages(official, max_pixels=112 * 112)[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_pil", "image_pil"]  # the text first, in place
    conv = prompts.pair_conversation(str(frames[0]), str(frames[1]), "Where is the door?",
                                     prompts.PromptStyle("json", "images_first", True))
    messages = to_vllm_messages(conv, max_pixels=112 * 112)
    assert messages[0] == conv[0]
    parts = messages[1]["content"]
    assert [p["type"] for p in parts] == ["image_pil", "image_pil", "text"]
    for part in parts[:2]:
        img = part["image_pil"]
        assert img.mode == "RGB" and img.width * img.height <= 112 * 112
        assert abs(img.width / img.height - 640 / 360) < 0.05
    assert parts[2] == conv[1]["content"][2]
    with pytest.raises(FileNotFoundError):
        to_vllm_messages(prompts.scene_conversation("/no/such.jpg"), 100)


def test_engine_kwargs(tiny_vlm_path: Path) -> None:
    cfg = BackendConfig(kind="vllm", model="tiny:vlm", max_pixels=200 * 200, seed=4)
    kwargs = engine_kwargs(cfg, gpus=6)
    assert kwargs["model"] == str(tiny_vlm_path) and kwargs["seed"] == 4
    assert kwargs["tensor_parallel_size"] == 4
    assert kwargs["mm_processor_kwargs"] == {"max_pixels": 200 * 200}
    assert kwargs["limit_mm_per_prompt"]["image"] >= 32  # a whole per_video window
    assert engine_kwargs(cfg, gpus=0)["tensor_parallel_size"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (separate environment)")
def test_vllm_on_gpu(tiny_vlm_path: Path, frames: list[Path]) -> None:
    # A released checkpoint can stand in where vLLM's kernels refuse the tiny model's
    # shapes: EMBODIED_R_VLLM_TEST_MODEL=/path/to/Qwen2.5-VL-3B-Instruct.
    model = os.environ.get("EMBODIED_R_VLLM_TEST_MODEL", str(tiny_vlm_path))
    backend = make_backend(BackendConfig(kind="vllm", model=model, max_new_tokens=48, max_pixels=112 * 112))
    convs = [
        prompts.scene_conversation(str(frames[0])),
        prompts.video_pair_conversation(str(frames[0]), str(frames[1])),
        prompts.scene_conversation("/no/such.jpg"),
    ]
    seen: list[int] = []
    out = backend.generate(convs, schemas=[prompts.SCENE_SCHEMA, prompts.VIDEO_PAIR_SCHEMA, None],
                           on_result=lambda i, g: seen.append(i))
    assert sorted(seen) == [0, 1, 2]
    assert out[0].error is None and out[1].error is None and out[2].error and "such.jpg" in out[2].error
    assert all(g.prompt_tokens > 0 and 1 <= g.completion_tokens <= 48 for g in out[:2])
    # Two images cost more prompt tokens than one.
    assert out[1].prompt_tokens > out[0].prompt_tokens
    # Structured outputs hold the reply to the schema (unless the budget cut it short).
    if out[1].completion_tokens < 48:
        assert json.loads(out[1].text)["action"] in prompts.ACTIONS
    again = backend.generate(convs[:2], schemas=[prompts.SCENE_SCHEMA, prompts.VIDEO_PAIR_SCHEMA])
    assert [g.text for g in again] == [g.text for g in out[:2]]  # greedy
    backend.close()
