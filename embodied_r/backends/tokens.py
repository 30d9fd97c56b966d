"""The pad token, checked against what the chat template writes: trainers mask padding by
token id, so a pad token the template writes into every prompt is masked there too, and
sampling dies on NaN probabilities. A model folder with one is refused before training
(``check_folder_pad``); a backend replaces it and says so (``safe_pad``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from embodied_r.errors import PadTokenError

log = logging.getLogger(__name__)

# The pad token a ChatML model usually has and its template never writes.
PREFERRED_PAD = "<|endoftext|>"


def template_token_ids(tokenizer: Any) -> set[int]:
    """The ids the chat template writes around empty turns: its own markers. Empty when it
    has no template or cannot render empty turns."""
    if not getattr(tokenizer, "chat_template", None):
        return set()
    ids: set[int] = set()
    system_user = [{"role": "system", "content": ""}, {"role": "user", "content": ""}]
    for messages, prompt in ((system_user, True), (system_user + [{"role": "assistant", "content": ""}], False)):
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        except Exception as exc:  # noqa: BLE001 - a template that insists on content: nothing to check
            log.debug("chat template does not render empty turns: %s", exc)
            return set()
        ids.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


def effective_pad(tokenizer: Any) -> tuple[str | None, bool]:
    """(the token trainers pad with, whether it is the tokenizer's own pad token)."""
    if tokenizer.pad_token is not None:
        return tokenizer.pad_token, True
    return tokenizer.eos_token, False


def pad_candidate(tokenizer: Any, template: set[int]) -> str | None:
    vocab = tokenizer.get_vocab()
    if PREFERRED_PAD in vocab and vocab[PREFERRED_PAD] not in template:
        return PREFERRED_PAD
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    for token_id, token in sorted(decoder.items()):
        if getattr(token, "special", False) and token_id not in template and str(token) != tokenizer.eos_token:
            return str(token)
    return None


def pad_problem(tokenizer: Any, folder: str) -> str | None:
    pad, own = effective_pad(tokenizer)
    if pad is None:
        return None
    template = template_token_ids(tokenizer)
    pad_id = tokenizer.convert_tokens_to_ids(pad)
    if pad_id not in template:
        return None
    what = (f"its pad token {pad!r}" if own
            else f"it has no pad token and its end-of-sequence token {pad!r}, which trainers pad with,")
    candidate = pad_candidate(tokenizer, template)
    fix = (f"set \"pad_token\": \"{candidate}\"" if candidate else "add a pad token the template never writes")
    from embodied_r.backends.smol import FOLDER, fetch_command

    again = f" (or convert it again: `{fetch_command(force=True)}`)" if Path(folder).name == FOLDER else ""
    return (f"model {folder}: {what} is a token its chat template writes into every prompt, so training would "
            f"mask it as padding (NaN probabilities); {fix} in {Path(folder) / 'tokenizer_config.json'}{again}")


def check_folder_pad(model: str) -> None:
    """A hub id or a folder without a tokenizer is left to the trainer."""
    folder = Path(model).expanduser()
    if not (folder / "tokenizer_config.json").is_file():
        return
    from transformers import AutoTokenizer

    problem = pad_problem(AutoTokenizer.from_pretrained(str(folder)), str(folder))
    if problem:
        raise PadTokenError(problem)


def safe_pad(tokenizer: Any, folder: str) -> None:
    """Give ``tokenizer`` a pad token the chat template never writes, for batched inference."""
    pad, own = effective_pad(tokenizer)
    template = template_token_ids(tokenizer)
    if pad is None or tokenizer.convert_tokens_to_ids(pad) not in template:
        if not own and pad is not None:
            tokenizer.pad_token = pad
        return
    candidate = pad_candidate(tokenizer, template)
    if candidate is None:
        log.warning("model %s pads with %r, which its chat template writes; no other special token to pad with",
                    folder, pad)
        tokenizer.pad_token = pad
        return
    log.warning("model %s: padding with %r instead of %r, which its chat template writes into every prompt",
                folder, candidate, pad)
    tokenizer.pad_token = candidate
