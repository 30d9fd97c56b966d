"""The tiny models in a shape vLLM's CPU build serves: ``tiny:lm-vllm`` and ``tiny:vlm-vllm``,
the GPU recipes' rehearsal models (``make rehearse``).

vLLM's CPU attention refuses a head of 16 ("Unsupported CPU attention configuration"), the
head ``tiny:lm`` and ``tiny:vlm`` have; 64 is one every backend of it serves. Kept out of
``tiny_models`` so that the stages of the recipes using those keep their keys.
"""

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
