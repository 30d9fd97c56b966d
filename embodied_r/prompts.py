"""Perception prompts, the parser of their answers, and the video text built from them.

Frame 0 is described alone; each later key frame is shown with the key frame before it
and the perceiver reports the action taken between them, what is newly visible, and
what bears on the question. The answers are strung together into the video text the
reasoning model reads: ``Frame 0: Observe: ...`` / ``Frame i: After <action>, Observe: ...``.

The version is part of every perception stage's identity: change a prompt, bump it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

from embodied_r.backends import Conversation

PROMPT_VERSION = "1"

ACTIONS: tuple[str, ...] = (
    "move forward",
    "move backward",
    "move left",
    "move right",
    "move up",
    "move down",
    "rotate left",
    "rotate right",
    "tilt up",
    "tilt down",
)
UNKNOWN_ACTION = "unknown"

SYSTEM = (
    "You are the eyes of an embodied agent that explores a scene and sees it through an "
    "egocentric camera. You describe what you see precisely and never answer the question "
    "you are given: another model will answer it from your descriptions."
)

FIRST_FRAME = (
    "This is the first key frame of the video, seen from the agent's point of view.\n"
    "Describe the scene. Give the spatial relations of the objects relative to the agent "
    "(left, right, ahead, behind, above, below, near, far) and describe every object named "
    "in the question below. Do not answer the question.\n"
    'Reply with a JSON object only: {"new_info": "<the scene and its spatial relations>", '
    '"question_info": "<the objects named in the question and where they are>"}'
)

PAIR = (
    "These are two consecutive key frames of the video: the first image is the previous "
    "key frame, the second image is the current one.\n"
    "(1) Which action did the agent take between them? Choose exactly one of: "
    + ", ".join(ACTIONS)
    + ".\n"
    "(2) What spatial information is newly visible in the current frame, relative to the agent?\n"
    "(3) Which objects related to the question are visible now, and where are they?\n"
    "Do not answer the question.\n"
    'Reply with a JSON object only: {"action": "<one action from the list>", '
    '"new_info": "<newly seen spatial information>", '
    '"question_info": "<question-related objects>"}'
)


def _image(path: str) -> dict[str, str]:
    return {"type": "image", "path": path}


def _conversation(images: list[str], instruction: str, question: str) -> Conversation:
    # Images first, then the fixed instruction, then the question: every question about
    # the same frames shares the longest possible prefix, which servers cache.
    content: list[dict[str, str]] = [_image(p) for p in images]
    content.append({"type": "text", "text": f"{instruction}\n\nQuestion: {question}"})
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]


def first_frame_conversation(image: str, question: str) -> Conversation:
    return _conversation([image], FIRST_FRAME, question)


def pair_conversation(previous: str, current: str, question: str) -> Conversation:
    return _conversation([previous, current], PAIR, question)


def question_with_options(question: str, options: Iterable[str] | None) -> str:
    lines = [question.strip()]
    lines += [o.strip() for o in options or [] if o and o.strip()]
    return "\n".join(lines)


# -- parsing ------------------------------------------------------------------------------

_SYNONYMS: dict[str, str] = {
    "go forward": "move forward",
    "fly forward": "move forward",
    "forward": "move forward",
    "go backward": "move backward",
    "move back": "move backward",
    "backward": "move backward",
    "go left": "move left",
    "strafe left": "move left",
    "go right": "move right",
    "strafe right": "move right",
    "ascend": "move up",
    "fly up": "move up",
    "rise": "move up",
    "descend": "move down",
    "fly down": "move down",
    "turn left": "rotate left",
    "yaw left": "rotate left",
    "turn right": "rotate right",
    "yaw right": "rotate right",
    "look up": "tilt up",
    "pitch up": "tilt up",
    "look down": "tilt down",
    "pitch down": "tilt down",
}
_PHRASES = sorted([(a, a) for a in ACTIONS] + list(_SYNONYMS.items()), key=lambda p: -len(p[0]))


_INFLECTIONS = [
    (re.compile(r"\b(mov|rotat)(?:es|ed|ing)\b"), r"\1e"),
    (re.compile(r"\b(turn|tilt|look|yaw|pitch|ascend|descend|strafe)(?:s|ed|ing)\b"), r"\1"),
    (re.compile(r"\b(?:went|goes|going)\b"), "go"),
    (re.compile(r"\b(?:flew|flies|flying)\b"), "fly"),
    (re.compile(r"\b(?:rose|rises|rising)\b"), "rise"),
]


def normalize_action(text: Any) -> str:
    """The first action named in ``text``, mapped to ``ACTIONS``; ``"unknown"`` if none."""
    if not isinstance(text, str):
        return UNKNOWN_ACTION
    flat = " " + re.sub(r"[\s_\-]+", " ", text.lower()) + " "
    for pattern, base in _INFLECTIONS:
        flat = pattern.sub(base, flat)
    best: tuple[int, str] | None = None
    for phrase, action in _PHRASES:
        # Longest phrases first, so "move forward" wins over its tail "forward".
        match = re.search(rf"(?<![a-z]){re.escape(phrase)}(?![a-z])", flat)
        if match and (best is None or match.start() < best[0]):
            best = (match.start(), action)
    return best[1] if best else UNKNOWN_ACTION


@dataclass
class FrameInfo:
    action: str  # one of ACTIONS, "unknown", or "" for frame 0
    new_info: str
    question_info: str
    parsed_as: str  # "json" | "labels" | "text"


_KEYS = {
    "action": "action",
    "new_info": "new_info",
    "newinfo": "new_info",
    "new_information": "new_info",
    "new_spatial_information": "new_info",
    "newly_seen": "new_info",
    "scene": "new_info",
    "description": "new_info",
    "observation": "new_info",
    "question_info": "question_info",
    "question_information": "question_info",
    "question_related": "question_info",
    "question_related_objects": "question_info",
    "question_objects": "question_info",
}


def _canonical_key(key: str) -> str | None:
    return _KEYS.get(re.sub(r"[^a-z]+", "_", key.lower()).strip("_"))


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "; ".join(_as_text(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_as_text(v)}" for k, v in value.items())
    return str(value)


def _json_objects(text: str) -> Iterable[dict[str, Any]]:
    """Every JSON object embedded in ``text`` (code fences and prose around it allowed)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


_LABEL = re.compile(
    r"^[\s>*#\-\d.()]*"  # bullets, markdown and numbering before the label are ignored
    r"(action(?: taken)?|new(?:ly seen)?[ _\-]?(?:spatial )?info(?:rmation)?|"
    r"question[ _\-]?(?:related[ _\-]?)?(?:info(?:rmation)?|objects?)|scene(?: description)?)"
    r"\s*\**\s*[:\-]\s*(.*)$",
    re.IGNORECASE,
)


def _labelled(text: str) -> dict[str, str]:
    fields: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        match = _LABEL.match(line)
        if match:
            label = match.group(1).lower()
            if label.startswith("action"):
                current = "action"
            elif label.startswith("question"):
                current = "question_info"
            else:
                current = "new_info"
            fields.setdefault(current, []).append(match.group(2).strip(" *"))
        elif current and line.strip():
            fields[current].append(line.strip())
    return {k: " ".join(v).strip() for k, v in fields.items()}


def parse_frame_response(text: str, first: bool) -> FrameInfo:
    """Read a perceiver answer: a JSON object (bare, fenced or inside prose), else
    labelled plain text (``Action: ...``), else the whole text as the observation."""
    fields: dict[str, str] = {}
    parsed_as = "text"
    for obj in _json_objects(text or ""):
        found = {}
        for key, value in obj.items():
            canonical = _canonical_key(str(key))
            if canonical and canonical not in found:
                found[canonical] = _as_text(value).strip()
        if found:
            fields, parsed_as = found, "json"
            break
    if not fields:
        fields = _labelled(text or "")
        parsed_as = "labels" if fields else "text"
    if not fields:
        fields = {"new_info": (text or "").strip()}
    action = "" if first else normalize_action(fields.get("action", ""))
    return FrameInfo(
        action=action,
        new_info=fields.get("new_info", ""),
        question_info=fields.get("question_info", ""),
        parsed_as=parsed_as,
    )


# -- video text ---------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip()


def observation(new_info: str, question_info: str) -> str:
    parts = [_one_line(new_info)]
    if _one_line(question_info):
        parts.append("Question-related: " + _one_line(question_info))
    return " ".join(p for p in parts if p)


def video_text(frames: list[FrameInfo]) -> str:
    """One line per key frame, in order; frame 0 has no action."""
    lines = []
    for i, frame in enumerate(frames):
        seen = observation(frame.new_info, frame.question_info)
        if i == 0:
            lines.append(f"Frame 0: Observe: {seen}")
        else:
            lines.append(f"Frame {i}: After {frame.action or UNKNOWN_ACTION}, Observe: {seen}")
    return "\n".join(lines)
