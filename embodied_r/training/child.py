"""What every trainer child shares, whichever pipeline starts it: the command line, precision,
the common trainer arguments, LoRA, the saved model, a result's counts and a clean end of a
multi-process launch. Apart from ``grpo`` so that the other pipeline's trainer, and its key,
involves none of GRPO's rewards and records."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

from embodied_r.backends.cpu_adapters import trainer_overrides
from embodied_r.backends.devices import Precision, training_precision
from embodied_r.training.environment import ADAPTER, CHECKPOINTS, LoraSettings, TrainerEnvironment
from embodied_r.training.trl_args import field_name

log = logging.getLogger("embodied_r.training.child")


def precision(env: TrainerEnvironment) -> Precision:
    chosen = training_precision(env.bf16, env.use_cpu)
    if chosen.note:
        log.warning(chosen.note)
    return chosen


def common_args(env: TrainerEnvironment, work: Path, run_name: str, report_to: list[str]) -> dict[str, Any]:
    from transformers import TrainingArguments

    chosen = precision(env)
    bf16 = chosen.bf16
    kwargs: dict[str, Any] = {
        "output_dir": str(work / CHECKPOINTS),
        "run_name": run_name,
        "use_cpu": env.use_cpu,
        "bf16": bf16,
        "fp16": chosen.fp16,
        field_name(TrainingArguments, "gradient_checkpointing"): env.gradient_checkpointing,
        "seed": env.seed,
        "logging_steps": env.logging_steps,
        "save_steps": env.save_steps,
        "save_total_limit": env.save_total_limit,
        "save_only_model": env.save_only_model,
        "report_to": report_to,
        "disable_tqdm": True,  # the parent streams our output into logs; bars only clutter them
    }
    if env.bf16_weights(bf16):
        # An fp32 master copy lives elsewhere (DeepSpeed, LoRA); else bf16 is mixed precision.
        kwargs["model_init_kwargs"] = {"dtype": "bfloat16"}
    # Several processes without CUDA (a rehearsal on a CPU) name their backend; on a GPU, nothing.
    kwargs.update(trainer_overrides(int(os.environ.get("WORLD_SIZE", "1"))))
    return kwargs


def peft_config(lora: LoraSettings | None) -> Any:
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules, init_lora_weights=lora.init_lora_weights)


def run_counts(trainer: Any, start_step: int, seconds: float) -> dict[str, Any]:
    # A resumed run's seconds per step are over the steps it ran itself.
    steps = int(trainer.state.global_step)
    here = max(steps - start_step, 0)
    return {"steps": steps, "steps_this_run": here, "resumed_from_step": start_step, "seconds": round(seconds, 3),
            "seconds_per_step": round(seconds / here, 4) if here else None}


def save_trained_model(trainer: Any, work: Path, lora: bool) -> None:
    """Full weights and tokenizer in ``work/model``; with LoRA the adapter in ``work/adapter``
    and its merge in ``work/model``."""
    model_dir = work / "model"
    tokenizer = trainer.processing_class
    if not lora:
        trainer.save_model(str(model_dir))  # every process takes part (ZeRO-3 gathers weights)
        if trainer.accelerator.is_main_process and tokenizer is not None:
            tokenizer.save_pretrained(str(model_dir))
        return
    trainer.save_model(str(work / ADAPTER))
    if trainer.accelerator.is_main_process:
        merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
        merged.save_pretrained(str(model_dir))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(model_dir))
    trainer.accelerator.wait_for_everyone()


def quiet_known_warnings() -> None:
    # TRL reads this deprecated property at every generation: one line per step in train.log.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def child_main(main: Callable[[str], int], module: str) -> None:
    if len(sys.argv) != 2:
        print(f"usage: python -m {module} SPEC.json", file=sys.stderr)
        sys.exit(2)
    from embodied_r.children import PARENT_PID_ENV, die_with_parent

    # A trainer must not outlive the run that started it (kill -9 included).
    die_with_parent(int(os.environ.get(PARENT_PID_ENV) or 0) or None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_known_warnings()
    code = main(sys.argv[1])
    end_process_group()
    sys.exit(code)


def end_process_group() -> None:
    """Tear the process group down while every rank is alive: left to interpreter shutdown, a
    rank that finishes first destroys gloo's joinable threads and aborts (SIGABRT) after its
    work is saved, and the launcher reports the whole stage failed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
