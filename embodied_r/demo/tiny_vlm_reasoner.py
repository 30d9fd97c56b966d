"""The Embodied-Reasoner demo's agent, ``tiny:vlm-reasoner``: a tiny Qwen2.5-VL built for the
agent's turns.

Its tokenizer keeps every fixed text of the agent's conversations whole (the system prompt,
the fixed parts of the task, action and feedback turns, the scripted expert's sentences, the
reply tags) and every object type the synthetic tasks and the built-in house name, and its
BPE learns the actions from a corpus of them (``navigate to Fridge``, ``pickup Mug``). A
ten-step trajectory then shrinks from about 3,200 tokens to a few hundred, most of them its
content: the task's objects and the actions. A reply is a handful of tokens, so a policy
that writes a wrong letter in the middle of a name (what a character-level tiny model does
on its own) cannot happen, and copying an object from the task into an action is copying one
token. That is what makes three SFT stages that visibly learn affordable on two CPU cores.
The weights are random until the SFT stages.

The folder is named by the spec's hash, so an edited text gets a new tokenizer and model.
``demo.models`` names it in the table of tiny models.
"""

from __future__ import annotations

from pathlib import Path

from embodied_r.demo.tiny_models import TinyVLMSpec, ensure_tiny_vlm
from embodied_r.interactive.synthetic import fixed_texts, object_types
from embodied_r.interactive.tasks import ACTION_VERBS

def corpus() -> str:
    """Every action on every object type, for the BPE's merges of the verbs."""
    verbs = [v for v in ACTION_VERBS if v != "init"]
    return "\n".join(f"{verb} {name}" for verb in verbs for name in object_types())


def vlm_reasoner_spec() -> TinyVLMSpec:
    # The plumbing model's size: on the demo's imitation data, wider and deeper ones (96 x 3,
    # 128 x 4) reached no higher success in as many steps, and took longer per step
    # (benchmarks/reasoner_learnability.py).
    return TinyVLMSpec(phrases=fixed_texts(), corpus=corpus())


def ensure_vlm_reasoner(root: Path) -> Path:
    return ensure_tiny_vlm(root, vlm_reasoner_spec())
