"""The prompt length limit of the official training: prompts cut from the left.

ms-swift, which ran the official GRPO training, encodes each prompt with the chat template
and, when it is longer than ``max_length`` (6144 tokens in the official script), keeps its
last ``max_length`` tokens: a long video text loses its system prompt and first frames, and
keeps the question. TRL 1.16 has no prompt limit, so ``limit_prompts`` does the same before
the trainer sees the data. Evaluation bounds its prompts with the same function, so a model
is asked at test time what it was trained on, and an over-long perception text cannot make
an in-process model allocate without bound.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def load_processing_class(model: str) -> Any:
    """What TRL's GRPOTrainer loads for ``model`` (a processor, or a tokenizer); the
    tokenizer alone when the processor cannot be built (its chat template is the same for
    text-only conversations)."""
    from transformers import AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(model, truncation_side="left", padding_side="left")
    except (ImportError, OSError, ValueError) as exc:
        log.warning("no processor for %s (%s); counting prompt tokens with its tokenizer", model, exc)
        return AutoTokenizer.from_pretrained(model, truncation_side="left", padding_side="left")


def templated(processing_class: Any, conversation: list[dict[str, Any]]) -> str:
    return processing_class.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


def left_truncate(texts: list[str], tokenizer: Any, max_tokens: int) -> tuple[list[str], int]:
    """Each text cut to its last ``max_tokens`` tokens; and how many were cut."""
    out, cut = [], 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            text = tokenizer.decode(ids[-max_tokens:], skip_special_tokens=False)
            cut += 1
        out.append(text)
    return out, cut


def limit_prompts(rows: list[dict[str, Any]], model: str | Any, max_prompt_length: int) -> int:
    """Apply the limit to dataset rows (``prompt``: the conversation) in place; returns how
    many prompts were cut. When none is too long the rows stay conversational; otherwise
    every prompt becomes its chat-templated text (a dataset holds one kind or the other),
    and TRL then passes those texts on as they are."""
    processing_class = load_processing_class(model) if isinstance(model, str) else model
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    texts = [templated(processing_class, row["prompt"]) for row in rows]
    limited, cut = left_truncate(texts, tokenizer, max_prompt_length)
    if cut:
        for row, text in zip(rows, limited):
            row["prompt"] = text
    return cut
