"""The GRPO settings that change results, named as TRL's ``GRPOConfig`` names them, so the
arguments passed to TRL and those ``grpo_args`` may not override derive from one class. The
defaults are the official script's and ms-swift 3.3's (docs/fidelity.md), not TRL's."""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo"]
SchedulerType = Literal["linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
                        "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr"]

# The one field whose GRPOConfig name differs: TRL has no warmup_ratio, and a float below 1
# in warmup_steps is a share of all steps.
TRL_NAMES = {"warmup_ratio": "warmup_steps"}


class GRPOSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(5e-7, ge=0)  # positive unless a control run (TrainingConfig)
    beta: float = Field(0.001, ge=0)  # KL weight, against a frozen reference (training.stage_chain)
    num_generations: int = Field(8, ge=2)
    max_completion_length: int = Field(2048, ge=1)
    # Completions per device per micro-step. 8 x 4 accumulation = 32 completions (4 prompts
    # x 8 generations) per optimizer step, the original's 8 GPUs x 1 x 4.
    per_device_train_batch_size: int = Field(8, ge=1)
    # None: derived from training.completions_per_step and the launch's process count.
    gradient_accumulation_steps: int | None = Field(4, ge=1)
    # Sampling of the rollouts: ms-swift passed top_p 0.9 and top_k 50 to vLLM.
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(0.9, gt=0, le=1)
    top_k: int = Field(50, ge=0)  # 0: off
    repetition_penalty: float = Field(1.0, gt=0)
    # The loss: "grpo" is a token mean per sequence, then a mean over sequences, ms-swift
    # 3.3's loss with one completion per device micro-batch (TRL's default is "dapo").
    loss_type: LossType = "grpo"
    # Advantages: rewards minus the group mean, over the group's standard deviation.
    scale_rewards: Literal["group", "batch", "none"] = "group"
    epsilon: float = Field(0.2, gt=0)  # the PPO clip range
    epsilon_high: float | None = Field(None, gt=0)  # None: symmetric clip
    # The optimizer (AdamW) and schedule: ms-swift's defaults.
    lr_scheduler_type: SchedulerType = "cosine"
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    weight_decay: float = Field(0.1, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)
    max_grad_norm: float = Field(1.0, gt=0)
    # TRL reweights vLLM rollouts by the trainer's and vLLM's token probabilities; the
    # official ms-swift 3.3 run had no such correction.
    vllm_importance_sampling_correction: bool = False

    def settings_kwargs(self, accumulation: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for name in GRPOSettings.model_fields:
            value = accumulation if name == "gradient_accumulation_steps" else getattr(self, name)
            if value is not None:
                kwargs[TRL_NAMES.get(name, name)] = value
        return kwargs


def owned_names(structural: set[str], vllm_fields: set[str]) -> frozenset[str]:
    names = set(GRPOSettings.model_fields) | set(TRL_NAMES.values())
    return frozenset(names | {f"vllm_{f}" for f in vllm_fields} | structural)


def launch_world(launcher: str, accelerate_processes: int | None) -> int | None:
    """Processes a stage trains in where known: ``WORLD_SIZE`` is set inside a launched trainer."""
    if launcher != "accelerate":
        return 1
    if accelerate_processes is not None:
        return accelerate_processes
    world = os.environ.get("WORLD_SIZE")
    return int(world) if world and world.isdigit() else None


def accumulation_for(per_step: int, per_device: int, world: int, generations: int) -> int:
    share = per_device * world
    if per_step % share or per_step % generations:
        raise ValueError(
            f"completions_per_step = {per_step} cannot be made of {world} processes x "
            f"per_device_train_batch_size {per_device} x a whole accumulation, in groups of "
            f"num_generations = {generations}: change per_device_train_batch_size or the process count"
        )
    return per_step // share
