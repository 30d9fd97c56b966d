"""The tiny models recipes name as ``tiny:<name>``: one table, and the one function that
resolves a name to its built folder.

``backends.models.resolve_model`` reaches ``resolve`` by this module's name when a reference
starts with ``tiny:``; nothing registers anything at import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from embodied_r.demo.tiny_models import ensure_tiny_lm, ensure_tiny_vlm
from embodied_r.demo.tiny_reasoner import ensure_reader, ensure_reasoner
from embodied_r.demo.tiny_vlm_reasoner import ensure_vlm_reasoner

# name -> builder of its folder under the root given (``$EMBODIED_R_HOME/models``).
TINY: dict[str, Callable[[Path], Path]] = {
    # Random weights: the plumbing (the smoke recipe, the tests).
    "lm": ensure_tiny_lm,
    "vlm": ensure_tiny_vlm,
    # The demo's reasoner: a tiny Qwen2 whose tokenizer keeps the prompts' fixed texts whole.
    "lm-reasoner": ensure_reasoner,
    # The same with the synthetic world's names kept whole, for reading traces.
    "lm-reader": ensure_reader,
    # The Embodied-Reasoner demo's agent: a tiny Qwen2.5-VL whose tokenizer keeps its turns' texts whole.
    "vlm-reasoner": ensure_vlm_reasoner,
}


def resolve(name: str, root: Path) -> Path:
    """The folder of ``tiny:<name>``, built under ``root`` on first use."""
    if name not in TINY:
        raise ValueError(f"unknown tiny model 'tiny:{name}'; the tiny models are "
                         + ", ".join(f"tiny:{n}" for n in TINY))
    return TINY[name](Path(root))
