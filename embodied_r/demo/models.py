"""The tiny models recipes name as ``tiny:<name>``: one table, and the one function that
resolves a reference to its built folder.

``backends.models.resolve_model`` reaches ``resolve`` by this module's name when a reference
starts with ``tiny:``; nothing registers anything at import. Each entry names its builder by
module, so a stage's key hashes the builder of the models its recipe names and no other
(``runners`` reads the table).
"""

from __future__ import annotations

import importlib
from pathlib import Path

# reference -> builder of its folder under the root given (``$EMBODIED_R_HOME/models``).
BY_NAME = {
    # Random weights: the plumbing (the smoke recipe, the tests).
    "tiny:lm": "embodied_r.demo.tiny_models:ensure_tiny_lm",
    "tiny:vlm": "embodied_r.demo.tiny_models:ensure_tiny_vlm",
    # The same in a shape vLLM's CPU build serves (head dim 64): the GPU recipes' rehearsal.
    "tiny:lm-vllm": "embodied_r.demo.tiny_engine_models:ensure_tiny_lm_vllm",
    "tiny:vlm-vllm": "embodied_r.demo.tiny_engine_models:ensure_tiny_vlm_vllm",
    # The demo's reasoner: a tiny Qwen2 whose tokenizer keeps the prompts' fixed texts whole.
    "tiny:lm-reasoner": "embodied_r.demo.tiny_reasoner:ensure_reasoner",
    # The same with the synthetic world's names kept whole, for reading traces.
    "tiny:lm-reader": "embodied_r.demo.tiny_reasoner:ensure_reader",
    # The Embodied-Reasoner demo's agent: a tiny Qwen2.5-VL whose tokenizer keeps its turns' texts whole.
    "tiny:vlm-reasoner": "embodied_r.demo.tiny_vlm_reasoner:ensure_vlm_reasoner",
}


def resolve(ref: str, root: Path) -> Path:
    """The folder of ``ref`` (``tiny:<name>``), built under ``root`` on first use."""
    if ref not in BY_NAME:
        raise ValueError(f"unknown tiny model {ref!r}; the tiny models are {', '.join(BY_NAME)}")
    module, function = BY_NAME[ref].split(":")
    return getattr(importlib.import_module(module), function)(Path(root))
