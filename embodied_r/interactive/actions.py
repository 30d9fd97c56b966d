"""Reading the agent's reply: the action in ``<DecisionMaking>``, its verb, and its object matched to a scene type."""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Callable

from embodied_r.interactive.tasks import ACTION_VERBS

# First match, one line only, case-sensitive: as the original reads it.
DECISION = re.compile(r"<DecisionMaking>(.*?)</DecisionMaking>")
NO_OBJECT_VERBS = ("end", "observe", "move forward")


@dataclass(frozen=True)
class Decision:
    raw: str  # the text inside the tag ("" when there is none)
    verb: str  # one of ACTION_VERBS, or "error"
    obj: str | None  # a scene object type, or None
    unmatched: str | None = None  # an object name that matched no type


# (the whole action text, the scene's types) -> a type, or None: the embedding matcher.
Matcher = Callable[[str, list[str]], "str | None"]

# Everyday names whose AI2-THOR type shares too few letters with them for any string rule; below
# ``threshold`` nothing matches and the action is refused, as the original's "No Suitable Object".
SYNONYMS = {
    "refrigerator": "Fridge", "trash can": "GarbageCan", "trashcan": "GarbageCan", "trash bin": "GarbageCan",
    "garbage bin": "GarbageCan", "bin": "GarbageCan", "couch": "Sofa", "counter": "CounterTop",
    "kitchen counter": "CounterTop", "countertop": "CounterTop", "cupboard": "Cabinet", "tv": "Television",
}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _words(text: str) -> tuple[str, ...]:
    """Lower-case words of a name or a CamelCase type ("DiningTable": dining, table)."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text)
    return tuple(w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w)


def _holds(outer: tuple[str, ...], inner: tuple[str, ...]) -> bool:
    return bool(inner) and any(outer[i:i + len(inner)] == inner for i in range(len(outer) - len(inner) + 1))


def similarity(name: str, kind: str) -> float:
    a, b = _norm(name), _norm(kind)
    if not a or not b:
        return 0.0
    score = SequenceMatcher(None, a, b).ratio()
    # Whole words only: "cupboard" holds the letters of Cup, not the word.
    wa, wb = _words(name), _words(kind)
    if _holds(wa, wb) or _holds(wb, wa) or a == b:
        score = max(score, 0.6 + 0.4 * min(len(a), len(b)) / max(len(a), len(b)))
    return score


def match_object(name: str, types: list[str], threshold: float = 0.6) -> str | None:
    unique = list(dict.fromkeys(types))
    if not unique:
        return None
    synonym = SYNONYMS.get(" ".join(_words(name)))
    if synonym is not None:
        return synonym if synonym in unique else None
    best = max(unique, key=lambda t: similarity(name, t))
    return best if similarity(name, best) >= threshold else None


def verb_of(raw: str) -> str:
    if "put in" in raw:
        return "put in"
    for verb in ACTION_VERBS:
        if raw.startswith(verb):
            return verb
    return "error"


def parse_decision(response: str, types: list[str], threshold: float = 0.6,
                   match: Matcher | None = None) -> Decision:
    found = DECISION.search(response or "")
    if not found:
        return Decision("", "error", None)
    raw = found.group(1)
    verb = verb_of(raw)
    if verb == "error" or raw.startswith(NO_OBJECT_VERBS):
        return Decision(raw, verb, None)
    words = raw[len(verb):].strip() if raw.startswith(verb) else raw.split(" ")[-1]
    if not words:
        return Decision(raw, verb, None)  # a bare "put": onto what the agent stands at
    last = raw.split(" ")[-1].strip()
    if last in types:
        return Decision(raw, verb, last)
    # The original hands its matcher the whole action text ("navigate to fridge").
    matched = match(raw.strip(), types) if match is not None else match_object(words, types, threshold)
    return Decision(raw, verb, matched, None if matched else words)
