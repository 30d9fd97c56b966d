"""The official training's prompt limit: ms-swift keeps a templated prompt's last
``max_length`` tokens (6144), losing the system prompt and first frames, keeping the question.
TRL has no limit, so ``limit_prompts`` cuts before the trainer; evaluation cuts the same way."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

log = logging.getLogger(__name__)


def load_processing_class(model: str) -> Any:
    """What TRL's GRPOTrainer loads for ``model``; the tokenizer alone when the processor
    cannot be built (its chat template is the same for text-only conversations)."""
    from transformers import AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(model, truncation_side="left", padding_side="left")
    except (ImportError, OSError, ValueError) as exc:
        log.warning("no processor for %s (%s); counting prompt tokens with its tokenizer", model, exc)
        return AutoTokenizer.from_pretrained(model, truncation_side="left", padding_side="left")


def templated(processing_class: Any, conversation: list[dict[str, Any]]) -> str:
    return processing_class.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)


def _cut_each(texts: list[str], tokenizer: Any, max_tokens: int) -> list[tuple[str, int]]:
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_tokens:
            text = tokenizer.decode(ids[-max_tokens:], skip_special_tokens=False)
        out.append((text, len(ids)))
    return out


def left_truncate(texts: list[str], tokenizer: Any, max_tokens: int) -> tuple[list[str], int]:
    done = _cut_each(texts, tokenizer, max_tokens)
    return [text for text, _ in done], sum(1 for _, n in done if n > max_tokens)


@dataclass(frozen=True)
class PromptCut:
    """What a prompt limit did to a set of prompts."""

    limit: int
    prompts: int
    cut: int = 0
    tokens: int = 0  # of the cut prompts, before the cut
    removed: int = 0  # from the cut prompts
    past_system: int = 0  # cut prompts that lost more than their system turn
    lost: Mapping[str, int] = field(default_factory=dict)  # part -> cut prompts that lost some of it

    def describe(self) -> str:
        if not self.cut:
            return f"prompts read whole: all {self.prompts} fit max_prompt_length={self.limit} tokens"
        line = (f"prompts read from their end, max_prompt_length={self.limit} tokens: {self.cut} of {self.prompts} "
                f"are cut, on average {self.removed / self.cut:.0f} of their {self.tokens / self.cut:.0f} tokens, "
                "from the start: the system prompt")
        if self.past_system:
            line += (" and the user turn's opening (the video text, earliest frames first)"
                     + ("" if self.past_system == self.cut else f" in {self.past_system} of them"))
        lost = {k: n for k, n in self.lost.items() if n}
        line += "".join(f"; {n} of them also lose the start of their {k}" for k, n in lost.items())
        kept = [k for k in self.lost if k not in lost]
        if kept:
            line += f"; every prompt keeps its {' and '.join(kept)} whole"
        return line


def _tokens(processing_class: Any, tokenizer: Any, conversation: list[dict[str, Any]]) -> int:
    if not conversation:
        return 0
    text = processing_class.apply_chat_template(conversation, tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def limit_prompts(rows: list[dict[str, Any]], model: str | Any, max_prompt_length: int,
                  parts: Mapping[str, Callable[[dict[str, Any]], Sequence[Any]]] | None = None) -> PromptCut:
    """Apply the limit to rows' ``prompt`` in place. When none is too long the rows stay
    conversational; else every prompt becomes its templated text (a dataset holds one kind).
    ``parts``: texts of a row that should reach the model whole, counted where the cut reaches."""
    processing_class = load_processing_class(model) if isinstance(model, str) else model
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    done = _cut_each([templated(processing_class, row["prompt"]) for row in rows], tokenizer, max_prompt_length)
    if all(n <= max_prompt_length for _, n in done):
        return PromptCut(max_prompt_length, len(rows))
    cut = tokens = past_system = 0
    lost = dict.fromkeys(parts or {}, 0)
    system_tokens: dict[str, int] = {}  # by the system turn's text: most rows share one
    for row, (text, n) in zip(rows, done):
        if n > max_prompt_length:
            cut, tokens = cut + 1, tokens + n
            system = [m for m in row["prompt"] if m.get("role") == "system"]
            key = repr(system)
            if key not in system_tokens:
                system_tokens[key] = _tokens(processing_class, tokenizer, system)
            past_system += n - max_prompt_length > system_tokens[key]
            for name, texts_of in (parts or {}).items():
                lost[name] += any(str(part) not in text for part in texts_of(row))
        row["prompt"] = text
    return PromptCut(max_prompt_length, len(rows), cut, tokens, tokens - cut * max_prompt_length, past_system, lost)
