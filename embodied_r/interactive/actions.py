"""Reading the agent's reply: the action in ``<DecisionMaking>``, its verb and its object
type, matched to the scene's object types.

The original matches an object name that is not exactly a scene type with an embedding
model (bge-small-en-v1.5, cosine > 0.2 on the whole action string). Here a local string
similarity stands in for it: the object words against each type name, case and spaces
ignored, with a containment bonus; below ``threshold`` nothing matches and the action is
refused with feedback, as the original's "No Suitable Object".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import SequenceMatcher

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


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def similarity(name: str, kind: str) -> float:
    a, b = _norm(name), _norm(kind)
    if not a or not b:
        return 0.0
    score = SequenceMatcher(None, a, b).ratio()
    if a in b or b in a:
        score = max(score, 0.6 + 0.4 * min(len(a), len(b)) / max(len(a), len(b)))
    return score


def match_object(name: str, types: list[str], threshold: float = 0.6) -> str | None:
    """The scene type most like ``name``, or None when none reaches ``threshold``."""
    unique = list(dict.fromkeys(types))
    if not unique:
        return None
    best = max(unique, key=lambda t: similarity(name, t))
    return best if similarity(name, best) >= threshold else None


def verb_of(raw: str) -> str:
    if "put in" in raw:
        return "put in"
    for verb in ACTION_VERBS:
        if raw.startswith(verb):
            return verb
    return "error"


def parse_decision(response: str, types: list[str], threshold: float = 0.6) -> Decision:
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
    matched = match_object(words, types, threshold)
    return Decision(raw, verb, matched, None if matched else words)
