"""The table of the ``tiny:<name>`` models' builders (``runners`` reads it for the keys) and their resolver."""

from __future__ import annotations

import importlib
from pathlib import Path

# reference -> builder of its folder under the root given (``$EMBODIED_R_HOME/models``).
BY_NAME = {
    "tiny:lm": "embodied_r.demo.tiny_models:ensure_tiny_lm",
    "tiny:vlm": "embodied_r.demo.tiny_models:ensure_tiny_vlm",
    "tiny:lm-vllm": "embodied_r.demo.tiny_engine_models:ensure_tiny_lm_vllm",
    "tiny:vlm-vllm": "embodied_r.demo.tiny_engine_models:ensure_tiny_vlm_vllm",
    "tiny:lm-reasoner": "embodied_r.demo.tiny_reasoner:ensure_reasoner",
    "tiny:lm-reader": "embodied_r.demo.tiny_reasoner:ensure_reader",
    "tiny:vlm-reasoner": "embodied_r.demo.tiny_vlm_reasoner:ensure_vlm_reasoner",
}


def resolve(ref: str, root: Path) -> Path:
    """The folder of ``ref``, built under ``root`` on first use."""
    if ref not in BY_NAME:
        raise ValueError(f"unknown tiny model {ref!r}; the tiny models are {', '.join(BY_NAME)}")
    module, function = BY_NAME[ref].split(":")
    return getattr(importlib.import_module(module), function)(Path(root))
