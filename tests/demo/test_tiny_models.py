"""Tiny local models: build, cache, reload, tokenize, generate."""

from __future__ import annotations

import os
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from embodied_r.backends.models import load_vlm_processor, resolve_model
from embodied_r.demo import tiny_models
from embodied_r.demo.tiny_models import (
    LM_SPECIAL,
    VLM_SPECIAL,
    TinyLMSpec,
    TinyVLMSpec,
    ensure_tiny_lm,
    train_tokenizer,
)
from embodied_r.paths import home

TEXTS = [
    "Frame 0: Observe: a street with buildings, a tree on the left.",
    "Frame 12: After rotate left, Observe: the tower's roof; it's 35.5 m away!!",
    "  leading spaces\n\n\ttabs and\r\nCRLF   trailing   ",
    "Ünïcödé façade, 東京タワー, emoji 🚁 and numbers 1234567890",
    "<|im_start|>user\nWhich option? A. left B. right<|im_end|>\n<think>x</think><answer>B</answer>",
    "don't, we'll, I'M, they've, she'd, THE END",
]


def test_home_follows_environment(embodied_r_home: Path) -> None:
    assert home() == embodied_r_home


def test_tokenizer_round_trip_after_reload(tiny_lm_path: Path) -> None:
    from transformers import AutoTokenizer

    fresh = train_tokenizer(TinyLMSpec().vocab_size, LM_SPECIAL)
    reloaded = AutoTokenizer.from_pretrained(tiny_lm_path)
    for text in TEXTS:
        ids = fresh(text)["input_ids"]
        assert reloaded(text)["input_ids"] == ids, text
        assert reloaded.decode(ids) == fresh.decode(ids)
    # Byte-level: any text comes back unchanged (NFC-normalised).
    for text in TEXTS:
        assert reloaded.decode(reloaded(text)["input_ids"]) == unicodedata.normalize("NFC", text)


def test_special_tokens_and_chat_template(tiny_lm_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    for token in LM_SPECIAL:
        assert len(tok(token, add_special_tokens=False)["input_ids"]) == 1
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.padding_side == "left"
    text = tok.apply_chat_template(
        [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == (
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_lm_builds_once_and_generates(tiny_lm_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = tiny_lm_path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert ensure_tiny_lm(tiny_lm_path.parent) == tiny_lm_path
    assert weights.stat().st_mtime_ns == stamp
    assert not [p for p in tiny_lm_path.parent.iterdir() if p.name.endswith(".tmp")]

    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tok)
    assert sum(p.numel() for p in model.parameters()) < 500_000
    batch = tok(["short", "a much longer prompt than the first"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] <= batch["input_ids"].shape[1] + 5
    # A prompt of about 3000 tokens fits the position limit.
    long = tok(" ".join(["forward"] * 3000), return_tensors="pt")
    assert long["input_ids"].shape[1] < model.config.max_position_embeddings
    with torch.no_grad():
        model(**long)


def test_spec_names_the_folder(tmp_path: Path) -> None:
    a, b = TinyLMSpec(), TinyLMSpec(seed=1)
    assert a.digest() == TinyLMSpec().digest() != b.digest()
    assert TinyVLMSpec().digest() != a.digest()
    with pytest.raises(ValueError):
        TinyLMSpec(hidden=3)  # unknown field


def test_resolve_model(tiny_lm_path: Path, tiny_vlm_path: Path) -> None:
    assert resolve_model("tiny:lm") == str(tiny_lm_path)
    assert resolve_model("tiny:vlm") == str(tiny_vlm_path)
    assert Path(resolve_model("tiny:lm")).parent == home() / "models"
    assert resolve_model("Qwen/Qwen2.5-3B-Instruct") == "Qwen/Qwen2.5-3B-Instruct"
    # A path names a folder: one that is not there is said so, not sent to the hub as an id.
    with pytest.raises(FileNotFoundError, match="model folder /some/folder does not exist"):
        resolve_model("/some/folder")


def test_an_unknown_tiny_model_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="'tiny:unknown'; the tiny models are tiny:lm, tiny:vlm, ") as refused:
        resolve_model("tiny:unknown")
    named = str(refused.value).split("the tiny models are ")[1].split(", ")
    assert {"tiny:lm-reasoner", "tiny:lm-vllm", "tiny:vlm-vllm"} <= set(named), named


def test_vlm_processor_and_generation(tiny_vlm_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    config = AutoConfig.from_pretrained(tiny_vlm_path)
    assert config.model_type == "qwen2_5_vl"
    head_dim = config.text_config.hidden_size // config.text_config.num_attention_heads
    assert sum(config.text_config.rope_parameters["mrope_section"]) == head_dim // 2

    tok = AutoTokenizer.from_pretrained(tiny_vlm_path)
    for token in VLM_SPECIAL:
        assert len(tok(token, add_special_tokens=False)["input_ids"]) == 1
    assert config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")

    processor = load_vlm_processor(tiny_vlm_path)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(tiny_vlm_path)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (90, 160, 3), dtype=np.uint8))
    conversations = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}],
        [{"role": "user", "content": [{"type": "text", "text": "No image, longer text."}]}],
    ]
    texts = [processor.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    assert "<|vision_start|><|image_pad|><|vision_end|>Describe." in texts[0]
    batch = processor(text=texts, images=[image], return_tensors="pt", padding=True)
    # The placeholder was expanded to one token per merged 28x28 patch.
    grid = batch["image_grid_thw"][0]
    n_image = int((batch["input_ids"][0] == config.image_token_id).sum())
    assert n_image == int(grid.prod()) // 4 > 1
    out = model.generate(**batch, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 2


def test_concurrent_build_leaves_one_folder(tmp_path: Path) -> None:
    spec = TinyLMSpec(seed=7)
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: ensure_tiny_lm(tmp_path, spec), range(2)))
    assert paths[0] == paths[1]
    # Whichever build lost the race cleaned up its private folder.
    assert sorted(p.name for p in tmp_path.iterdir()) == [paths[0].name]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(paths[0]))
    assert paths[0].name == f"tiny-lm-{spec.digest()}"
    assert tiny_models.BUILD_VERSION >= 1
