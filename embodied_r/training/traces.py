"""Reasoning traces that read: the perception words that decide a question (the record's
``fact``, which the synthetic generator writes and no prompt contains; quoted as perception said
them, errors included), then the option they point to ("Frame 6: the green sphere is on my left.
The option that says I turn left is D."). A record without a fact gets its answer alone."""

from __future__ import annotations

import json
import re
from typing import Any

_FRAME_RE = re.compile(r"^Frame (\d+):\s*(?:After (.+?),\s*)?Observe:\s*(.*)$")
# A clause of an observation ends at a semicolon, or at a full stop before a space or the end
# (not the one inside "1.7 m").
_CLAUSE_END = re.compile(r";|\.(?=\s|$)")
MAP_PHRASE = "The option that says"
UNKNOWN = "unknown"  # what perception writes when the perceiver named no movement


def frames(prompt: str) -> list[tuple[int, str | None, str]]:
    found = []
    for line in prompt.splitlines():
        match = _FRAME_RE.match(line.strip())
        if match:
            found.append((int(match.group(1)), match.group(2), match.group(3).strip()))
    return found


def clause(observation: str, name: str) -> str | None:
    """The clause that last mentions ``name``, from the mention (with its article) to its end."""
    text = observation
    at = text.lower().rfind(name.lower())
    if at < 0:
        return None
    start = at - 4 if text[max(at - 4, 0):at].lower() == "the " else at
    end = _CLAUSE_END.search(text, at)
    return text[start:end.start() if end else len(text)].strip()


def _first_mention(seen: list[tuple[int, str | None, str]], name: str) -> tuple[int, str] | None:
    for index, _, observation in seen:
        found = clause(observation, name)
        if found:
            return index, found
    return None


def quote(fact: dict[str, Any], prompt: str, max_objects: int = 2) -> str:
    seen = frames(prompt)
    kind, objects = fact.get("kind"), list(fact.get("objects") or [])
    if kind == "place_now":
        name = objects[0] if objects else ""
        for index, _, observation in reversed(seen):
            found = clause(observation, name) if name else None
            if found:
                return f"Frame {index}: {found}"
        return f"No frame shows the {name}"
    if kind == "last_action":
        moved = [(i, a) for i, a, _ in seen if a]
        if not moved:
            return "No frame says how I moved"
        index, action = moved[-1]
        return f"Frame {index}: after {action}"
    if kind == "turn_to":
        name = objects[0] if objects else ""
        first = _first_mention(seen, name) if name else None
        if first is None:
            return f"No frame shows the {name}"
        index, found = first
        action = next((a for i, a, _ in seen if i == index and a), None)
        return f"Frame {index}: after {action}, {found}" if action else f"Frame {index}: {found}"
    if kind == "first_seen":
        firsts = [(_first_mention(seen, name), name) for name in objects]
        shown = sorted((m[0], name) for m, name in firsts if m)
        parts = [f"the {name} in frame {index}" for index, name in shown]
        parts += [f"the {name} in no frame" for m, name in firsts if m is None]
        return "First seen: " + ", ".join(parts) if parts else "No frame shows them"
    if kind == "positions":
        parts = []
        for name in objects[:max_objects]:
            first = _first_mention(seen, name)
            parts.append(f"Frame {first[0]}: {first[1]}" if first else f"No frame shows the {name}")
        return "; ".join(parts) if parts else "The frames show the room"
    if kind == "actions":
        moves = [a for _, a, _ in seen if a and a != UNKNOWN][:4]
        return "I " + ", then ".join(moves) if moves else "No frame says how I moved"
    raise ValueError(f"unknown fact kind {kind!r}")


def _option_texts(record: dict[str, Any]) -> dict[str, str]:
    out = {}
    for option in record.get("options") or []:
        text = str(option).strip()
        if text[:1].isalpha() and text[1:2] in (".", ")", ":"):
            out[text[:1].upper()] = text[2:].strip().rstrip(".")
    return out


def option_text(record: dict[str, Any]) -> str:
    """The gold option less the words every option begins with ("on my left" of "The red cube
    is on my left")."""
    texts = _option_texts(record)
    gold = texts.get(str(record["solution"]).upper(), "")
    words = [t.split() for t in texts.values()]
    shared = 0
    while len(words) > 1 and all(len(w) > shared + 1 and w[shared] == words[0][shared] for w in words):
        shared += 1
    return " ".join(gold.split()[shared:])


def read_fact(record: dict[str, Any]) -> dict[str, Any] | None:
    raw = record.get("fact") or ""
    return json.loads(raw) if raw else None


def fact_think(record: dict[str, Any], max_objects: int = 2) -> str:
    fact = read_fact(record)
    answer = str(record["solution"])
    if record.get("answer_type") == "number":
        conclusion = f"So the answer is {answer}."
    else:
        text = option_text(record)
        conclusion = f"{MAP_PHRASE} {text} is {answer}." if text else f"So {answer}."
    if fact is None:
        return conclusion
    return f"{quote(fact, record['prompt'], max_objects)}. {conclusion}"
