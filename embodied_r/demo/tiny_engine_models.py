"""``tiny:lm-vllm`` and ``tiny:vlm-vllm``, the rehearsal's models: heads of 64, as vLLM's CPU attention
refuses 16; apart from ``tiny_models`` so that the recipes on those keep their keys."""

from __future__ import annotations

from pathlib import Path

from embodied_r.demo.tiny_models import TinyLMSpec, TinyVLMSpec, ensure_tiny_lm, ensure_tiny_vlm

# Two layers of two heads of 64 and one key-value head; embeddings tied as in Qwen2.5-3B, the
# paper's policy, whose tied head is where a stale weight sync hides.
ENGINE_SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=1)


def ensure_tiny_lm_vllm(root: Path) -> Path:
    """The rehearsal's policy and consistency reference."""
    return ensure_tiny_lm(root, TinyLMSpec(**ENGINE_SHAPE))


def ensure_tiny_vlm_vllm(root: Path) -> Path:
    """The rehearsal's perceiver."""
    return ensure_tiny_vlm(root, TinyVLMSpec(**ENGINE_SHAPE))
