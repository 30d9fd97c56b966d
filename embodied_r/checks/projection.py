"""GPU-hours of the paper's three-stage GRPO schedule from per-token rates measured on one card,
for any training-set size and completion length. A step decodes its completions together (one
token of each per decoding step), runs every sequence forward and backward once, steps once."""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULE_EPOCHS = 12  # the paper's three stages: 2 + 2 + 8 epochs
PROMPTS_PER_STEP = 4
COMPLETIONS_PER_PROMPT = 8
SWEEP = (300, 512, 1024, 1536, 2048)


@dataclass(frozen=True)
class Figures:
    """Per-GPU rates; a decoding step moves every sequence of the batch one token further."""

    decode_ms_per_step: float
    update_tokens_per_s: float
    optimizer_step_s: float


@dataclass(frozen=True)
class Projection:
    completion_tokens: int
    steps: int
    seconds_per_step: float
    eval_seconds: float
    gpu_hours: float


def project(figures: Figures, train_prompts: int, val_prompts: int, prompt_tokens: int,
            completion_tokens: int, gpus: int = 1, epochs: float = SCHEDULE_EPOCHS,
            eval_every: int = 100) -> Projection:
    """The schedule's GPU-hours on ``gpus`` cards that split each step's work evenly."""
    steps = math.ceil(train_prompts * epochs / PROMPTS_PER_STEP)
    completions = PROMPTS_PER_STEP * COMPLETIONS_PER_PROMPT
    generate = completion_tokens * figures.decode_ms_per_step / 1000
    update = completions * (prompt_tokens + completion_tokens) / figures.update_tokens_per_s
    per_step = (generate + update + figures.optimizer_step_s) / gpus
    # Validation decodes its prompts a step's batch at a time.
    eval_rounds = steps // eval_every * math.ceil(val_prompts / completions)
    eval_seconds = eval_rounds * generate / gpus
    return Projection(completion_tokens, steps, per_step, eval_seconds,
                      gpus * (steps * per_step + eval_seconds) / 3600)


def sweep(figures: Figures, train_prompts: int, val_prompts: int, prompt_tokens: int, gpus: int = 1,
          lengths: tuple[int, ...] = SWEEP) -> list[Projection]:
    return [project(figures, train_prompts, val_prompts, prompt_tokens, n, gpus) for n in lengths]


def table(projections: list[Projection]) -> str:
    rows = ["| mean completion (tokens) | steps | s/step | evaluation (h) | GPU-hours |", "|---|---|---|---|---|"]
    rows += [f"| {p.completion_tokens} | {p.steps} | {p.seconds_per_step:.1f} | {p.eval_seconds / 3600:.1f} "
             f"| {p.gpu_hours:.1f} |" for p in projections]
    return "\n".join(rows)
