"""The trainer process of one Embodied-Reasoner SFT stage:
``python -m embodied_r.interactive.sft_child SPEC``.

TRL's ``SFTTrainer`` on multi-image conversations with this module's collator. Labels: loss
on assistant turns only; in a conversation with a ``<|feedback|>`` turn, every assistant
turn before the first such turn is masked too. That is the original's rule (mask every
token up to the first ``<|feedback|>``) stated per turn: what lies between the last masked
assistant turn and the marker is user text, masked anyway, so no special token is needed.
Images are loaded at most ``max_pixels`` each. Conversations over ``max_length`` tokens are
left out, not truncated.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from embodied_r.backends.images import load_image
from embodied_r.backends.models import IM_END, IM_START, load_vlm_processor, vlm_class
from embodied_r.interactive.episode import conversation
from embodied_r.interactive.prompts import FEEDBACK
from embodied_r.interactive.sft_config import ReasonerSFTConfig
from embodied_r.io import read_json, write_json_atomic
from embodied_r.training.callbacks import drop_raw_log_printers, sft_step_callback
from embodied_r.training.environment import RESULT_NAME, progress_callback
from embodied_r.training.child import precision
from embodied_r.training.learning import HISTORY_FILE, first_last

log = logging.getLogger("embodied_r.interactive.sft_child")
IGNORE = -100


def supervised_turns(messages: list[dict[str, str]]) -> list[bool]:
    """For each assistant message in order: does it carry loss?"""
    first_feedback = next((i for i, m in enumerate(messages) if m["role"] == "user" and FEEDBACK in m["content"]),
                          -1)
    return [i > first_feedback for i, m in enumerate(messages) if m["role"] == "assistant"]


def assistant_spans(ids: list[int], start_ids: list[int], end_id: int) -> list[tuple[int, int]]:
    """Token spans of assistant replies (content and closing ``<|im_end|>``), in order."""
    spans, n, i = [], len(start_ids), 0
    while i <= len(ids) - n:
        if ids[i:i + n] == start_ids:
            j = i + n
            k = ids.index(end_id, j) if end_id in ids[j:] else len(ids) - 1
            spans.append((j, k + 1))
            i = k + 1
        else:
            i += 1
    return spans


def labels_for(ids: list[int], messages: list[dict[str, str]], start_ids: list[int], end_id: int) -> list[int]:
    labels = [IGNORE] * len(ids)
    for (a, b), keep in zip(assistant_spans(ids, start_ids, end_id), supervised_turns(messages)):
        if keep:
            labels[a:b] = ids[a:b]
    return labels


class Collator:
    def __init__(self, processor: Any, max_pixels: int):
        self.processor, self.max_pixels = processor, max_pixels
        tok = processor.tokenizer
        self.start_ids = tok.encode(f"{IM_START}assistant\n", add_special_tokens=False)
        self.end_id = tok.convert_tokens_to_ids(IM_END)

    def encode(self, example: dict[str, Any]) -> dict[str, Any]:
        import torch

        messages = json.loads(example["conversation"])
        conv = conversation(messages, example["image_files"])
        text = self.processor.apply_chat_template(
            [{**m, "content": [p if p["type"] == "text" else {"type": "image"} for p in m["content"]]}
             if not isinstance(m["content"], str) else m for m in conv], tokenize=False)
        images = [load_image(p, self.max_pixels) for p in example["image_files"]]
        floor = self.processor.image_processor.size.get("shortest_edge", 28 * 28)
        batch = self.processor(text=[text], images=images or None, return_tensors="pt",
                               size={"longest_edge": self.max_pixels, "shortest_edge": min(floor, self.max_pixels)})
        ids = batch["input_ids"][0].tolist()
        batch["labels"] = torch.tensor([labels_for(ids, messages, self.start_ids, self.end_id)])
        return batch

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if len(examples) != 1:
            raise ValueError("the collator takes one conversation per device batch (as the paper trains)")
        return dict(self.encode(examples[0]))


def quarters(history: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    """Mean of ``key`` over the first and the last quarter of the logged steps (a quarter
    holds at least one step): single steps are too noisy to say whether a stage learned."""
    values = [float(e[key]) for e in history if isinstance(e.get(key), (int, float)) and "train_runtime" not in e]
    first, last = first_last(values)
    return {"first": first, "last": last, "steps": len(values)}


def learning_figures(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Token accuracy and loss, first and last quarter, and the highest learning rate logged
    (about the one set when the stage left its warm-up; far below it when it never did)."""
    rates = [float(e["learning_rate"]) for e in history if isinstance(e.get("learning_rate"), (int, float))]
    return {"token_accuracy": quarters(history, "mean_token_accuracy"), "loss": quarters(history, "loss"),
            "peak_learning_rate": max(rates) if rates else None}


def main(spec_path: str) -> int:
    spec = read_json(Path(spec_path))
    cfg = ReasonerSFTConfig.model_validate(spec["sft"])
    work = Path(spec["work"])
    import torch
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    if spec.get("torch_threads"):
        torch.set_num_threads(int(spec["torch_threads"]))

    processor = load_vlm_processor(spec["init_model"])
    collator = Collator(processor, cfg.max_pixels)
    # Column names TRL does not take for a vision dataset: this collator does the vision part.
    rows = [{"conversation": json.dumps(t["messages"]), "image_files": t["images"]}
            for t in read_json(Path(spec["data"]))]
    kept, too_long = [], 0
    for row in rows:
        n = collator.encode(row)["input_ids"].shape[1]
        if n <= cfg.max_length:
            kept.append(row)
        else:
            too_long += 1
    if not kept:
        raise ValueError(f"no conversation fits max_length={cfg.max_length}")
    on_gpu = torch.cuda.is_available() and not cfg.use_cpu
    chosen = precision(cfg)
    # bf16 weights only beside an fp32 master copy (DeepSpeed, LoRA): a plain AdamW would
    # round every small update away (TrainerEnvironment.bf16_weights); else fp32 weights
    # and bf16 as autocast mixed precision.
    model = vlm_class(spec["init_model"]).from_pretrained(
        spec["init_model"], dtype=torch.bfloat16 if cfg.bf16_weights(chosen.bf16) else torch.float32)
    if cfg.freeze_vision:
        for p in model.model.visual.parameters():  # the merger (projector) lives inside visual
            p.requires_grad = False
    report_to = ["mlflow"] if os.environ.get("MLFLOW_RUN_ID") else []
    args = SFTConfig(
        output_dir=str(work / "checkpoints"), use_cpu=not on_gpu, bf16=chosen.bf16, fp16=chosen.fp16, seed=cfg.seed,
        learning_rate=cfg.learning_rate, num_train_epochs=cfg.epochs, max_steps=cfg.max_steps or -1,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, warmup_steps=cfg.warmup_ratio,
        lr_scheduler_type=cfg.lr_scheduler_type, logging_steps=cfg.logging_steps, save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit, gradient_checkpointing=cfg.gradient_checkpointing and on_gpu,
        report_to=report_to, remove_unused_columns=False, disable_tqdm=True,
        dataset_kwargs={"skip_prepare_dataset": True}, max_length=None, run_name=spec.get("name", "reasoner-sft"))
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(kept), data_collator=collator,
                         processing_class=processor.tokenizer,
                         callbacks=[progress_callback(), sft_step_callback(spec.get("stage", "reasoner_sft"))])
    drop_raw_log_printers(trainer)
    started = time.monotonic()
    output = trainer.train()
    final = work / "model"
    trainer.save_model(str(final))
    processor.tokenizer.save_pretrained(str(final))
    processor.image_processor.save_pretrained(str(final))
    losses = [e["loss"] for e in trainer.state.log_history if isinstance(e.get("loss"), (int, float))]
    result = {"steps": int(trainer.state.global_step), "seconds": round(time.monotonic() - started, 3),
              "train_conversations": len(kept), "too_long": too_long, "train_loss": float(output.training_loss),
              "first_loss": float(losses[0]) if losses else None, "final_loss": float(losses[-1]) if losses else None,
              "learning_rate": cfg.learning_rate, "warmup_steps": args.get_warmup_steps(trainer.state.max_steps),
              **learning_figures(trainer.state.log_history)}
    if trainer.accelerator.is_main_process:
        write_json_atomic(work / HISTORY_FILE, trainer.state.log_history)
        write_json_atomic(work / RESULT_NAME, result)
    return 0


if __name__ == "__main__":
    from embodied_r.training.child import child_main

    child_main(main, "embodied_r.interactive.sft_child")
