"""Settings of one Embodied-Reasoner SFT stage: the shared SFT settings and what multi-image turns add."""

from __future__ import annotations

from pydantic import Field

from embodied_r.training.sft_settings import SFTSettings


class ReasonerSFTConfig(SFTSettings):
    # Images are resized to at most this many pixels before the processor sees them.
    max_pixels: int = Field(180_000, ge=28 * 28)
    freeze_vision: bool = True  # the vision tower and the projector, as in the paper
