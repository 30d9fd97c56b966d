"""``tiny:vlm-reasoner``: a tiny Qwen2.5-VL whose tokenizer keeps the agent's fixed texts and object types
whole, so copying an object is copying one token: what lets the SFT stages learn on two CPU cores."""

from __future__ import annotations

from pathlib import Path

from embodied_r.demo.tiny_models import TinyVLMSpec, ensure_tiny_vlm
from embodied_r.interactive.synthetic import fixed_texts, object_types
from embodied_r.interactive.tasks import ACTION_VERBS


def corpus() -> str:
    """Every action on every object type, for the BPE's merges."""
    verbs = [v for v in ACTION_VERBS if v != "init"]
    return "\n".join(f"{verb} {name}" for verb in verbs for name in object_types())


def vlm_reasoner_spec() -> TinyVLMSpec:
    # The plumbing model's size: wider and deeper ones (96 x 3, 128 x 4) learnt no better in as many
    # steps, and took longer per step (benchmarks/reasoner_learnability.py).
    return TinyVLMSpec(phrases=fixed_texts(), corpus=corpus())


def ensure_vlm_reasoner(root: Path) -> Path:
    return ensure_tiny_vlm(root, vlm_reasoner_spec())
