"""Settings of one Embodied-Reasoner SFT stage (the trainer environment's fields included)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from embodied_r.training.environment import TrainerEnvironment


class ReasonerSFTConfig(TrainerEnvironment):
    learning_rate: float = Field(1e-5, gt=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)  # a cap for demos; None trains the epochs
    per_device_train_batch_size: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    lr_scheduler_type: Literal["cosine", "linear", "constant"] = "cosine"
    # Images are resized to at most this many pixels before the processor sees them.
    max_pixels: int = Field(180_000, ge=28 * 28)
    max_length: int = Field(32_768, ge=16)  # longer conversations are left out, not cut
    freeze_vision: bool = True  # the vision tower and the projector, as in the paper
