"""Failed generations: the original inference server's long-context retry, and the episode loop's replies."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

from embodied_r.backends.images import load_image
from embodied_r.errors import GenerationUnavailable

Conversation = list[dict[str, Any]]


def image_paths(conversation: Conversation) -> list[str]:
    return [p["path"] for m in conversation if isinstance(m["content"], list)
            for p in m["content"] if p.get("type") == "image"]


def _replace_image(conversation: Conversation, index: int, path: str) -> Conversation:
    out, seen = [], 0
    for m in conversation:
        if not isinstance(m["content"], list):
            out.append(m)
            continue
        parts = []
        for p in m["content"]:
            if p.get("type") == "image":
                if seen == index:
                    p = {**p, "path": path}
                seen += 1
            parts.append(p)
        out.append({**m, "content": parts})
    return out


def halve_image(path: str, max_pixels: int) -> str:
    """A copy within ``max_pixels // 2`` pixels beside it (PNG, nearest-neighbour)."""
    budget = max_pixels // 2
    target = Path(path).with_name(f"{Path(path).stem}.half{budget}.png")
    if not target.exists():
        load_image(path, budget, "png-nearest").save(target)
    return str(target)


def retry_variants(conversation: Conversation, halve: Callable[[str], str]) -> Iterator[Conversation]:
    """The conversations of the retries after a failed call, at most ``2 * images``: after try ``t``,
    image ``t`` (never the first) halved while there is one; then one unchanged try marks the history
    for shortening, and from then on a conversation of over ``2t + 2`` messages keeps ``[2:2t]``."""
    # The original's slice, kept as it is: it drops the system prompt and the first turn, and the
    # latest turns as well.
    current = conversation
    shorten = False
    for attempt in range(1, 2 * len(image_paths(conversation)) + 1):
        paths = image_paths(current)
        if shorten and len(current) > 2 * attempt + 2:
            current = current[2:2 * attempt]
        elif len(paths) > attempt:
            current = _replace_image(current, attempt, halve(paths[attempt]))
        else:
            shorten = True
        yield current


def replies(generate: Callable[[list[Conversation]], list[Any]], conversations: list[Conversation],
            max_pixels: int, retry: bool) -> list[str | None]:
    """One reply per conversation, None where the call failed (after the long-context retry with ``retry``)."""
    out: list[str | None] = []
    for conversation, gen in zip(conversations, generate(conversations)):
        _raise_if_infra(gen)
        text = gen.text if gen.error is None else None
        if text is None and retry:
            for variant in retry_variants(conversation, lambda p: halve_image(p, max_pixels)):
                again = generate([variant])[0]
                _raise_if_infra(again)
                if again.error is None:
                    text = again.text
                    break
        out.append(text)
    return out


def _raise_if_infra(gen: Any) -> None:
    # The server down or a refused key is no item's fault: it stops the stage.
    if getattr(gen, "infra_failed", False):
        raise GenerationUnavailable(f"the model service failed: {gen.error}; start it (or fix its key) and run "
                                    "again: finished episodes are kept")
