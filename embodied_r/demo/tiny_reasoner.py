"""``tiny:lm-reasoner``: a tiny Qwen2 whose tokenizer keeps the prompts' fixed texts as one token each
(790 tokens become 340), what makes training the demo's reasoner affordable on a CPU."""

from __future__ import annotations

import re
from pathlib import Path

from embodied_r.demo.tiny_models import TinyLMSpec, ensure_tiny_lm
from embodied_r.scoring.reference_prompts import (
    REFERENCE_SYSTEM,
    REFERENCE_TEMPLATE_CHOICE,
    REFERENCE_TEMPLATE_NUMBER,
)
from embodied_r.training.prompts import (
    DEFAULT_CHOICE_INSTRUCTION,
    DEFAULT_NUMBER_INSTRUCTION,
    DEFAULT_SYSTEM,
    DEFAULT_TEMPLATE,
    DEFAULT_VIDEO_PREAMBLE,
)

TAGS = ("<think>", "</think>", "<answer>", "</answer>")
# The words of the warm start's reasoning traces (``warmstart.think_text``), for the BPE's merges.
CORPUS = "\n".join([
    "I move forward, then rotate left, then move up. I see the red cube and the blue sphere. So A.",
    "I rotate right, then tilt down, then move backward. I see nothing of the question. So B: I turn left.",
    "I move left, then move right, then move down, then tilt up. I see the green cylinder. So C: I rise.",
    "So D: I descend. So E: I fly forward. So F: I fly backward. So G: I rotate the camera upward.",
])


def world_words() -> tuple[str, ...]:
    """The synthetic world's names as the perception text writes them: things, places, movements."""
    from embodied_r.demo.world_perceiver import PLACE
    from embodied_r.perception.prompts import ACTIONS
    from embodied_r.synthetic.urban import URBAN_THINGS
    from embodied_r.synthetic.vsi import VSI_THINGS

    things = [f"{c} {s}" for c, s in URBAN_THINGS] + [t[0] for t in VSI_THINGS]
    return tuple(dict.fromkeys([*things, *PLACE.values(), "behind me", *ACTIONS]))


def fixed_parts(template: str) -> list[str]:
    return [part for part in re.split(r"\{\w+\}", template) if part.strip()]


def reasoner_spec(reading: bool = False) -> TinyLMSpec:
    phrases = [DEFAULT_SYSTEM, DEFAULT_VIDEO_PREAMBLE, *fixed_parts(DEFAULT_TEMPLATE),
               DEFAULT_CHOICE_INSTRUCTION, DEFAULT_NUMBER_INSTRUCTION, REFERENCE_SYSTEM,
               *fixed_parts(REFERENCE_TEMPLATE_CHOICE), *fixed_parts(REFERENCE_TEMPLATE_NUMBER), *TAGS]
    return TinyLMSpec(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, phrases=tuple(dict.fromkeys(phrases)), corpus=CORPUS,
                      words=world_words() if reading else ())


def ensure_reasoner(root: Path) -> Path:
    return ensure_tiny_lm(root, reasoner_spec())


def ensure_reader(root: Path) -> Path:
    """``tiny:lm-reader``: the reasoner with the world's names kept whole, for reading traces."""
    return ensure_tiny_lm(root, reasoner_spec(reading=True))
