"""The trainer process of every SFT run (``python -m embodied_r.training.sft_child SPEC``), in
both pipelines. What it trains on comes from the hook ``SPEC["examples"]`` names
(``module:function``), which validates the stage's settings and returns an ``SFTData``; writes
``model/``, ``history.json`` and ``train_result.json``."""

from __future__ import annotations

import importlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from embodied_r.io import read_json, write_json_atomic
from embodied_r.training.callbacks import drop_raw_log_printers, sft_step_callback
from embodied_r.training.checkpoints import last_checkpoint
from embodied_r.training.sft_settings import SFTSettings
from embodied_r.training.environment import RESULT_NAME, progress_callback
from embodied_r.training.child import child_main, common_args, peft_config, run_counts, save_trained_model
from embodied_r.training.learning import HISTORY_FILE, sft_figures
from embodied_r.training.trl_args import build_config

log = logging.getLogger("embodied_r.training.sft_child")


@dataclass
class SFTData:
    cfg: SFTSettings
    dataset: Any  # a datasets.Dataset of the examples that fit max_length
    processing_class: Any  # the tokenizer, saved beside the model
    too_long: list[str]  # ids of the examples left out
    collator: Any = None  # None: TRL's own
    dataset_args: dict[str, Any] = field(default_factory=dict)  # how TRL reads the dataset
    prepare_model: Callable[[Any], None] | None = None  # on the model TRL built, before training
    save_beside: Callable[[Path], None] | None = None  # more files in the saved model's folder


def sft_args(cfg: SFTSettings, work: Path, report_to: list[str], dataset_args: dict[str, Any] | None = None,
             run_name: str = "sft") -> Any:
    from trl import SFTConfig as TRLSFTConfig

    kwargs = common_args(cfg, work, run_name, report_to)
    kwargs.update(cfg.trainer_settings())
    kwargs.update(dataset_args or {})
    kwargs.update(cfg.sft_args)
    return build_config(TRLSFTConfig, kwargs)


def main(spec_path: str) -> int:
    spec = read_json(Path(spec_path))
    work = Path(spec["work"])
    if spec.get("torch_threads"):
        import torch

        torch.set_num_threads(int(spec["torch_threads"]))
    from datasets import disable_progress_bars
    from trl import SFTTrainer

    disable_progress_bars()  # the dataset passes' bars; the parent draws the training's own
    module, _, function = spec["examples"].partition(":")
    data: SFTData = getattr(importlib.import_module(module), function)(spec)
    cfg = data.cfg
    if data.too_long:
        log.warning("%d examples longer than max_length=%d left out", len(data.too_long), cfg.max_length)
    if not len(data.dataset):
        raise ValueError(f"no example fits max_length={cfg.max_length} tokens; raise the stage's max_length")
    stage = spec.get("stage", "sft")
    args = sft_args(cfg, work, [], data.dataset_args, stage)
    # TRL's own reporting would rename the stage's run and log flat names.
    steps = sft_step_callback(stage, os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI"))
    resume, start_step = last_checkpoint(work)
    # A resumed model is built from the checkpoint: from_pretrained maps a VL model's saved key
    # names to its own, where the Trainer's load matches none of a Qwen2(.5)-VL's and only warns
    # (transformers#43701). LoRA adapters and DeepSpeed state load as the Trainer saved them.
    built = resume if resume and cfg.lora is None and not cfg.deepspeed() else None

    class Trainer(SFTTrainer):
        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            if built is None:
                super()._load_from_checkpoint(resume_from_checkpoint, model)

    trainer = Trainer(model=built or spec["init_model"], args=args, train_dataset=data.dataset,
                      data_collator=data.collator, processing_class=data.processing_class,
                      peft_config=peft_config(cfg.lora), callbacks=[progress_callback(), steps])
    drop_raw_log_printers(trainer)
    if data.prepare_model is not None:
        data.prepare_model(trainer.model)
    if resume:
        log.info("resuming SFT from %s", resume)
    started = time.monotonic()
    output = trainer.train(resume_from_checkpoint=resume)
    seconds = time.monotonic() - started
    save_trained_model(trainer, work, lora=cfg.lora is not None)

    history = trainer.state.log_history
    losses = [e["loss"] for e in history if isinstance(e.get("loss"), (int, float))]
    result = {**run_counts(trainer, start_step, seconds), "train_records": len(data.dataset),
              "too_long": data.too_long, "epochs": cfg.epochs, "lora": cfg.lora is not None,
              "processes": int(trainer.accelerator.num_processes), "train_loss": float(output.training_loss),
              "first_loss": float(losses[0]) if losses else None, "final_loss": float(losses[-1]) if losses else None,
              "learning_rate": cfg.learning_rate, "warmup_steps": args.get_warmup_steps(trainer.state.max_steps),
              **sft_figures(history)}
    if trainer.accelerator.is_main_process:
        if data.save_beside is not None:
            data.save_beside(work / "model")
        write_json_atomic(work / HISTORY_FILE, history)
        write_json_atomic(work / RESULT_NAME, result)
    return 0


if __name__ == "__main__":
    child_main(main, "embodied_r.training.sft_child")
