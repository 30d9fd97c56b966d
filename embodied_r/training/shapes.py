"""A policy's shape, the one input of the memory estimate that comes from the model: from its
``config.json`` where there is one, else from the shapes of the models the recipes name."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """Qwen2 layout (biased q/k/v, gated MLP); ``vision_parameters``: a VL model's vision
    tower, which the policy drops and an in-process reference loads."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool = True
    vision_parameters: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def parameters(self) -> int:
        h, kv = self.hidden_size, self.kv_width
        attention = h * h + h + 2 * (h * kv + kv) + h * h
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + h

    def config_kwargs(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("vision_parameters")
        return data


# The shipped recipes' policies, from their published config.json, for when it is not here.
KNOWN_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-VL-3B-Instruct": ModelShape(151936, 2048, 36, 16, 2, 11008, True, vision_parameters=668_000_000),
    "Qwen/Qwen2.5-0.5B-Instruct": ModelShape(151936, 896, 24, 14, 2, 4864, True),
}


def shape_from_config(data: dict[str, Any]) -> ModelShape:
    text = {**data, **(data.get("text_config") or {})}
    names = [f for f in ModelShape.__dataclass_fields__ if f != "vision_parameters"]
    missing = [n for n in names if n != "tie_word_embeddings" and text.get(n) is None]
    if missing:
        raise ValueError(f"config lacks {', '.join(missing)}: not a decoder this estimate knows")
    values = {n: text[n] for n in names if text.get(n) is not None}
    values["tie_word_embeddings"] = bool(data.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    return ModelShape(**values)


def shape_of(model: str) -> ModelShape | None:
    """From a local ``config.json``, else the hub cache's (never downloaded), else ``KNOWN_SHAPES``."""
    folder = Path(model).expanduser()
    config = folder / "config.json" if folder.is_dir() else None
    if config is None:
        try:
            from huggingface_hub import hf_hub_download

            config = Path(hf_hub_download(model, "config.json", local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached here
            config = None
    if config is not None and config.is_file():
        shape = shape_from_config(json.loads(config.read_text()))
        known = KNOWN_SHAPES.get(model)
        return shape if known is None else ModelShape(**{**asdict(shape), "vision_parameters": known.vision_parameters})
    return KNOWN_SHAPES.get(model)
