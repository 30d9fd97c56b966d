"""What an Embodied-Reasoner SFT stage trains on: its multi-image conversations, their collator and labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embodied_r.backends.images import load_image
from embodied_r.backends.models import IM_END, IM_START, load_vlm_processor
from embodied_r.interactive.episode import conversation
from embodied_r.interactive.prompts import FEEDBACK
from embodied_r.interactive.sft_config import ReasonerSFTConfig
from embodied_r.io import read_json
from embodied_r.training.sft_child import SFTData

IGNORE = -100


def supervised_turns(messages: list[dict[str, str]]) -> list[bool]:
    """For each assistant message: does it carry loss? Those before the first ``<|feedback|>`` turn do
    not: the original masks every token up to it, and what lies between is user text, masked anyway."""
    first_feedback = next((i for i, m in enumerate(messages) if m["role"] == "user" and FEEDBACK in m["content"]),
                          -1)
    return [i > first_feedback for i, m in enumerate(messages) if m["role"] == "assistant"]


def assistant_spans(ids: list[int], start_ids: list[int], end_id: int) -> list[tuple[int, int]]:
    """Token spans of assistant replies, their closing ``<|im_end|>`` included."""
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


def freeze_vision(model: Any) -> None:
    """The vision tower and the projector (the merger is inside ``visual``), whatever wraps the model."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "visual":
            for p in module.parameters():
                p.requires_grad = False


def conversations(spec: dict[str, Any]) -> SFTData:
    from datasets import Dataset

    cfg = ReasonerSFTConfig.model_validate(spec["sft"])
    processor = load_vlm_processor(spec["init_model"])
    collator = Collator(processor, cfg.max_pixels)
    kept, too_long = [], []
    for t in read_json(Path(spec["data"])):
        # Column names TRL does not take for a vision dataset: this collator does the vision part.
        row = {"conversation": json.dumps(t["messages"]), "image_files": t["images"]}
        if collator.encode(row)["input_ids"].shape[1] <= cfg.max_length:
            kept.append(row)
        else:
            too_long.append(t["id"])
    return SFTData(cfg, Dataset.from_list(kept), processor.tokenizer, too_long, collator,
                   dataset_args={"remove_unused_columns": False, "dataset_kwargs": {"skip_prepare_dataset": True}},
                   prepare_model=freeze_vision if cfg.freeze_vision else None,
                   save_beside=processor.image_processor.save_pretrained)
