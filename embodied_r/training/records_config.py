"""The convert stage's config: how a GRPO record's prompt is written and measured."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from embodied_r.training.prompts import (DEFAULT_CHOICE_INSTRUCTION, DEFAULT_NUMBER_INSTRUCTION, DEFAULT_SYSTEM,
                                         DEFAULT_TEMPLATE, DEFAULT_VIDEO_PREAMBLE)


class RecordsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    system_prompt: str = DEFAULT_SYSTEM
    video_preamble: str = DEFAULT_VIDEO_PREAMBLE
    # Fields: {preamble}, {video_text}, {question} (question with options), {instruction}.
    template: str = DEFAULT_TEMPLATE
    # {question}, {options}: in the user turn and for the consistency reference.
    question_template: str = "{question}\nOptions:\n{options}"
    # "paraphrase" (this project's), or "official@<commit>" when the recipe's prompts file set them.
    prompts: str = "paraphrase"
    # Appended to the user turn; "" adds nothing (the official user turn).
    choice_instruction: str = DEFAULT_CHOICE_INSTRUCTION
    number_instruction: str = DEFAULT_NUMBER_INSTRUCTION
    # The policy's, filled in by the pipeline; None: prompts are not measured.
    tokenizer: str | None = None
    # Longer training prompts go to failures.parquet (prompt_too_long): a colocated vLLM step
    # fails on them. Filled in from training.vllm; None: no limit.
    max_prompt_tokens: int | None = Field(None, ge=1)


def prompt_token_limit(training: Any) -> int | None:
    """vLLM's ``max_model_length`` less ``max_completion_length`` (they share its context); None
    without one, or when the trainer's ``max_prompt_length`` already cuts every prompt to fit."""
    vllm = getattr(training, "vllm", None)
    if vllm is None or vllm.max_model_length is None:
        return None
    limit = vllm.max_model_length - training.max_completion_length
    if limit <= 0:
        raise ValueError(f"training.vllm.max_model_length {vllm.max_model_length} leaves no room for a prompt "
                         f"beside max_completion_length {training.max_completion_length}")
    cut = getattr(training, "max_prompt_length", None)
    if cut is not None and cut <= limit:
        return None
    return limit


def for_policy(cfg: RecordsConfig, training: Any) -> RecordsConfig:
    updates: dict[str, Any] = {}
    if cfg.tokenizer is None:
        updates["tokenizer"] = training.policy
    if cfg.max_prompt_tokens is None:
        updates["max_prompt_tokens"] = prompt_token_limit(training)
    return cfg.model_copy(update=updates)
