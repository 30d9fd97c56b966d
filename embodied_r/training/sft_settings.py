"""What changes the result of an SFT run in either pipeline: each pipeline's config derives
from ``SFTSettings`` with its own defaults, and the SFT child hands all of it to TRL."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from embodied_r.training.environment import TrainerEnvironment
from embodied_r.training.grpo_settings import SchedulerType

# Names TRL's SFTConfig gives SFTSettings' fields (a float below 1 in warmup_steps: a share of all steps).
TRL_SFT_NAMES = {"epochs": "num_train_epochs", "warmup_ratio": "warmup_steps"}


class SFTSettings(TrainerEnvironment):
    """None is left to a library default. The defaults are the Embodied-Reasoner paper's, the
    optimizer's as its trainer (transformers') kept them."""

    learning_rate: float = Field(1e-5, gt=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int | None = Field(None, ge=1)  # a cap for demos; None trains the epochs
    per_device_train_batch_size: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    lr_scheduler_type: SchedulerType = "cosine"
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    adam_epsilon: float = Field(1e-8, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    # Tokens of one example; longer ones are left out and listed: a cut would lose the supervised end.
    max_length: int = Field(32_768, ge=16)
    # Further TRL SFTConfig arguments, passed through as they are.
    sft_args: dict[str, Any] = Field(default_factory=dict)

    def trainer_settings(self) -> dict[str, Any]:
        names = set(SFTSettings.model_fields) - set(TrainerEnvironment.model_fields) - {"sft_args"}
        kwargs = {TRL_SFT_NAMES.get(name, name): getattr(self, name) for name in names}
        # The token cross-entropy both papers train with (TRL also offers "dft").
        return {**kwargs, "max_steps": self.max_steps or -1, "loss_type": "nll"}
