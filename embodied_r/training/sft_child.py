"""The trainer process of the SFT baseline: ``python -m embodied_r.training.sft_child SPEC``.

SPEC is the JSON written by ``sft.run_sft``. This process builds TRL's ``SFTTrainer`` on
the records as prompt/completion conversations (loss on the completion only), leaves
out records longer than ``max_length`` (truncation would cut the answer off), resumes
from the last checkpoint, saves the model to ``work/model`` and writes
``work/train_result.json`` for the parent.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from embodied_r.io import read_json, write_json_atomic
from embodied_r.training.config import SFTConfig
from embodied_r.training.sft import sft_target
from embodied_r.training.grpo import (
    child_main,
    common_args,
    conversation,
    last_checkpoint,
    peft_config,
    read_records,
    run_counts,
    save_trained_model,
)
from embodied_r.training.callbacks import drop_raw_log_printers, sft_step_callback
from embodied_r.training.environment import RESULT_NAME, progress_callback
from embodied_r.training.trl_args import build_config

log = logging.getLogger("embodied_r.training.sft_child")


def sft_examples(records: list[dict[str, Any]], think: str) -> list[dict[str, Any]]:
    """Conversational prompt/completion pairs: the record's prompt, and its own ``target``
    when it has one (the warm start's traces), else the fixed-think target."""
    return [
        {
            "uid": r["uid"],
            "prompt": conversation(r),
            "completion": [{"role": "assistant", "content": r.get("target") or sft_target(r, think)}],
        }
        for r in records
    ]


def cut_prompts(examples: list[dict[str, Any]], tokenizer: Any, max_prompt_length: int) -> list[dict[str, Any]]:
    """Prompts cut to their last ``max_prompt_length`` tokens, as the GRPO stages and evaluation
    cut them (``backends.truncation``). A cut prompt is chat-templated text, so every example
    becomes text: its completion too, closed by the end-of-turn token TRL appends."""
    from embodied_r.backends.truncation import limit_prompts

    cut = [dict(e) for e in examples]  # limit_prompts rewrites rows in place
    if not limit_prompts(cut, tokenizer, max_prompt_length):
        return examples
    return [{**e, "completion": e["completion"][0]["content"]} for e in cut]


def split_by_length(examples: list[dict[str, Any]], tokenizer: Any, max_length: int
                    ) -> tuple[list[dict[str, Any]], list[str]]:
    """Examples whose chat-formatted prompt and completion fit ``max_length`` tokens, and
    the uids of those that do not."""
    kept, too_long = [], []
    for example in examples:
        if isinstance(example["prompt"], str):  # cut prompts: templated text
            ids = tokenizer(example["prompt"] + example["completion"], add_special_tokens=False)
        else:
            ids = tokenizer.apply_chat_template(example["prompt"] + example["completion"], tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding in recent transformers
            ids = ids["input_ids"]
        if len(ids) <= max_length:
            kept.append(example)
        else:
            too_long.append(example["uid"])
    return kept, too_long


def sft_args(cfg: SFTConfig, work: Path, report_to: list[str]) -> Any:
    from trl import SFTConfig as TRLSFTConfig

    kwargs = common_args(cfg, work, "sft", report_to)
    kwargs.update({
        "num_train_epochs": cfg.epochs,
        "max_steps": cfg.max_steps or -1,
        "learning_rate": cfg.learning_rate,
        "warmup_steps": cfg.warmup_ratio,  # a float below 1 is a share of all steps
        "per_device_train_batch_size": cfg.per_device_train_batch_size,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "max_length": cfg.max_length,
        "completion_only_loss": True,
    })
    kwargs.update(cfg.sft_args)
    return build_config(TRLSFTConfig, kwargs)


def main(spec_path: str) -> int:
    spec = read_json(Path(spec_path))
    cfg = SFTConfig.model_validate(spec["sft"])
    work = Path(spec["work"])

    from datasets import Dataset, disable_progress_bars
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    disable_progress_bars()  # the dataset passes' bars; the parent draws the training's own

    tokenizer = AutoTokenizer.from_pretrained(spec["init_model"])
    examples = sft_examples(read_records(Path(spec["records"])), cfg.think)
    if cfg.max_prompt_length is not None:
        examples = cut_prompts(examples, tokenizer, cfg.max_prompt_length)
    examples, too_long = split_by_length(examples, tokenizer, cfg.max_length)
    if too_long:
        log.warning("%d records longer than max_length=%d left out", len(too_long), cfg.max_length)
    if not examples:
        raise ValueError(f"no record fits max_length={cfg.max_length} tokens; raise sft max_length")
    dataset = Dataset.from_list([{k: e[k] for k in ("prompt", "completion")} for e in examples])
    run_id, uri = os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI")
    steps = sft_step_callback(spec.get("stage", "sft"), run_id, uri)
    trainer = SFTTrainer(model=spec["init_model"], args=sft_args(cfg, work, []), train_dataset=dataset,
                         processing_class=tokenizer, peft_config=peft_config(cfg.lora),
                         callbacks=[progress_callback(), steps])
    drop_raw_log_printers(trainer)

    resume, start_step = last_checkpoint(work)
    if resume:
        log.info("resuming SFT from %s", resume)
    started = time.monotonic()
    output = trainer.train(resume_from_checkpoint=resume)
    seconds = time.monotonic() - started
    save_trained_model(trainer, work, lora=cfg.lora is not None)

    losses = [e["loss"] for e in trainer.state.log_history if isinstance(e.get("loss"), (int, float))]
    result = {
        **run_counts(trainer, start_step, seconds),
        "train_records": len(examples),
        "too_long": too_long,
        "epochs": cfg.epochs,
        "lora": cfg.lora is not None,
        "processes": int(trainer.accelerator.num_processes),
        "final_loss": float(losses[-1]) if losses else None,
        "first_loss": float(losses[0]) if losses else None,
        "train_loss": float(output.training_loss),
    }
    if trainer.accelerator.is_main_process:
        write_json_atomic(work / RESULT_NAME, result)
    return 0


if __name__ == "__main__":
    child_main(main, "embodied_r.training.sft_child")
