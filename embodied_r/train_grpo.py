"""The trainer process of one GRPO stage: ``python -m embodied_r.train_grpo SPEC``.

SPEC is the JSON written by ``training.run_training_stage``. This process builds TRL's
``GRPOTrainer`` on the stage's records, resumes from the last checkpoint in the stage's
work folder if there is one, saves the final model and tokenizer to ``work/model`` and
writes ``work/train_result.json`` for the parent.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from embodied_r.io import read_json, write_json_atomic
from embodied_r.rewards import accuracy_reward, format_reward, make_consistency_reward
from embodied_r.training import CHECKPOINTS, RESULT_NAME, GRPOStageConfig, TrainingConfig

log = logging.getLogger("embodied_r.train_grpo")

# Columns the reward functions read; TRL hands every non-prompt column to them.
REWARD_COLUMNS = ("uid", "category", "solution", "answer_type", "question", "options")


def load_dataset(records: Path) -> Any:
    """``train.parquet`` as a conversational dataset: prompt = system + user turns."""
    from datasets import Dataset

    rows = pq.read_table(Path(records) / "train.parquet").to_pylist()
    if not rows:
        raise ValueError(f"{records}/train.parquet holds no records; nothing to train on")
    data = [
        {
            "prompt": [
                {"role": "system", "content": r["system"]},
                {"role": "user", "content": r["prompt"]},
            ],
            **{c: r[c] for c in REWARD_COLUMNS},
        }
        for r in rows
    ]
    return Dataset.from_list(data)


def reward_setup(stage: GRPOStageConfig, cfg: TrainingConfig) -> tuple[list[Any], list[float]]:
    """Reward functions and weights of a stage. A zero-weight consistency reward is left
    out altogether, so its reference model is never loaded or asked."""
    funcs: list[Any] = [format_reward, accuracy_reward]
    weights = [stage.format_weight, stage.accuracy_weight]
    if stage.consistency_weight > 0:
        funcs.append(make_consistency_reward(cfg.reference, require_correct=cfg.consistency_requires_correct))
        weights.append(stage.consistency_weight)
    return funcs, weights


def grpo_args(stage: GRPOStageConfig, cfg: TrainingConfig, work: Path, weights: list[float],
              report_to: list[str]) -> Any:
    from trl import GRPOConfig

    if cfg.bf16 is not None:
        bf16 = cfg.bf16
    else:
        import torch

        bf16 = not cfg.use_cpu and torch.cuda.is_available()
    kwargs: dict[str, Any] = {
        "output_dir": str(work / CHECKPOINTS),
        "run_name": stage.name,
        "num_train_epochs": stage.epochs,
        "max_steps": cfg.max_steps_per_stage or -1,
        "learning_rate": cfg.learning_rate,
        "warmup_steps": cfg.warmup_ratio,
        "beta": cfg.beta,
        "num_generations": cfg.num_generations,
        "max_completion_length": cfg.max_completion_length,
        "per_device_train_batch_size": cfg.per_device_train_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "temperature": cfg.temperature,
        "reward_weights": weights,
        "use_cpu": cfg.use_cpu,
        "bf16": bf16,
        "activation_checkpointing": cfg.gradient_checkpointing,
        "seed": cfg.seed,
        "logging_steps": cfg.logging_steps,
        "save_steps": cfg.save_steps,
        "save_total_limit": cfg.save_total_limit,
        "log_completions": cfg.log_completions,
        "report_to": report_to,
        "disable_tqdm": True,  # the parent streams our output into logs; bars only clutter them
    }
    if bf16:
        # Weights in bfloat16 as the original trained them; TRL would load float32.
        kwargs["model_init_kwargs"] = {"dtype": "bfloat16"}
    kwargs.update(cfg.grpo_args)
    return GRPOConfig(**kwargs)


def _last(history: list[dict[str, Any]], key: str) -> float | None:
    for entry in reversed(history):
        value = entry.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def _mean(history: list[dict[str, Any]], key: str) -> float | None:
    values = [float(e[key]) for e in history if isinstance(e.get(key), (int, float)) and math.isfinite(e[key])]
    return sum(values) / len(values) if values else None


def result_figures(history: list[dict[str, Any]], reward_names: list[str]) -> dict[str, Any]:
    """Final and stage-mean figures from the trainer's log history."""
    out: dict[str, Any] = {}
    keys = ["reward", "kl", "loss", "completions/mean_length", "completions/clipped_ratio"]
    keys += [f"rewards/{name}/mean" for name in reward_names]
    for key in keys:
        name = key.replace("/", "_")
        last, mean = _last(history, key), _mean(history, key)
        if last is not None:
            out[f"final_{name}"] = last
        if mean is not None:
            out[f"mean_{name}"] = mean
    return out


def main(spec_path: str) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = read_json(Path(spec_path))
    cfg = TrainingConfig.model_validate(spec["training"])
    stage = GRPOStageConfig.model_validate(spec["stage"])
    work = Path(spec["work"])

    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOTrainer

    dataset = load_dataset(Path(spec["records"]))
    funcs, weights = reward_setup(stage, cfg)
    report_to = ["mlflow"] if os.environ.get("MLFLOW_RUN_ID") else []
    args = grpo_args(stage, cfg, work, weights, report_to)
    trainer = GRPOTrainer(model=spec["init_model"], reward_funcs=funcs, args=args, train_dataset=dataset)

    checkpoints = work / CHECKPOINTS
    resume = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    if resume:
        log.info("resuming stage %s from %s", stage.name, resume)
    start_step = int(resume.rsplit("-", 1)[-1]) if resume else 0
    started = time.monotonic()
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.monotonic() - started

    model_dir = work / "model"
    trainer.save_model(str(model_dir))  # every process takes part (ZeRO-3 gathers weights)
    if trainer.accelerator.is_main_process and trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(str(model_dir))
    for func in funcs:
        close = getattr(func, "close", None)
        if close is not None:
            close()

    steps = int(trainer.state.global_step)
    steps_here = max(steps - start_step, 0)
    reward_names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    result = {
        "steps": steps,
        "steps_this_run": steps_here,
        "resumed_from_step": start_step,
        "seconds": round(seconds, 3),
        "seconds_per_step": round(seconds / steps_here, 4) if steps_here else None,
        "train_records": len(dataset),
        "epochs": stage.epochs,
        "reward_funcs": reward_names,
        "reward_weights": weights,
        **result_figures(trainer.state.log_history, reward_names),
    }
    # Only the main process reports; the others of a multi-GPU launch just exit.
    if trainer.accelerator.is_main_process:
        write_json_atomic(work / RESULT_NAME, result)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m embodied_r.train_grpo SPEC.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
