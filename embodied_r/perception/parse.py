"""Reading the perceiver's replies (in the form asked for first, then numbered points, JSON
whole or cut off, labelled text, and last the whole text), and the video text built from
them: ``Frame 0: Observe: ...`` / ``Frame i: After <action>, Observe: ...``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

from embodied_r.perception.prompts import ACTIONS, UNKNOWN_ACTION, ReplyFormat

_SYNONYMS: dict[str, str] = {
    "go forward": "move forward", "fly forward": "move forward", "forward": "move forward",
    "go backward": "move backward", "move back": "move backward", "backward": "move backward",
    "go left": "move left", "strafe left": "move left", "go right": "move right", "strafe right": "move right",
    "ascend": "move up", "fly up": "move up", "rise": "move up", "descend": "move down", "fly down": "move down",
    "turn left": "rotate left", "yaw left": "rotate left", "turn right": "rotate right", "yaw right": "rotate right",
    "look up": "tilt up", "pitch up": "tilt up", "look down": "tilt down", "pitch down": "tilt down",
}
_PHRASES = sorted([(a, a) for a in ACTIONS] + list(_SYNONYMS.items()), key=lambda p: -len(p[0]))

_INFLECTIONS = [
    # "move upward", "tilt downward" (the official list's words), "forwards".
    (re.compile(r"\b(up|down|for|back)wards?\b"), lambda m: {"for": "forward", "back": "backward"}.get(
        m.group(1), m.group(1))),
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
    parsed_as: str  # "numbered" | "json" | "partial_json" | "labels" | "text"


_KEYS = {
    "action": "action",
    **dict.fromkeys(("new_info", "newinfo", "new_information", "new_spatial_information", "newly_seen", "scene",
                     "description", "observation"), "new_info"),
    **dict.fromkeys(("question_info", "question_information", "question_related", "question_related_objects",
                     "question_objects"), "question_info"),
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
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj


# A "key": "value pair, the value possibly cut off by the token limit.
_LOOSE_PAIR = re.compile(r'"([A-Za-z][\w \-]*)"\s*:\s*"((?:[^"\\]|\\.)*)')


def _loose_pairs(text: str) -> dict[str, str]:
    """String fields of a JSON object that does not parse (cut off at the token limit)."""
    pairs = {}
    for key, value in _LOOSE_PAIR.findall(text):
        try:
            pairs[key] = json.loads(f'"{value}"')
        except json.JSONDecodeError:
            pairs[key] = value.rstrip("\\")
    return pairs


def _fields_from(obj: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in obj.items():
        canonical = _canonical_key(str(key))
        if canonical and canonical not in found:
            found[canonical] = _as_text(value).strip()
    return found


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


# A numbered point's marker: "1.", "1)", "(1)", "1:", after markdown ("###", "**", "-").
_POINT_AT_LINE = re.compile(r"^[ \t>#*_\-]*\(?([1-9])(?:[.):]|\)\.)(?!\d)[ \t*_]*", re.MULTILINE)
_POINT_INLINE = re.compile(r"(?:^|(?<=\s))\(?([1-9])[.)](?!\d)\s*")
# A label at the start of a point ("**Action:**", "New information -"), dropped.
_POINT_LABEL = re.compile(r"^\s*\**\s*([A-Za-z][A-Za-z \-/]{0,40}?)\s*\**\s*[:\-–]\s*\**\s*")
_LABEL_WORDS = ("action", "movement", "new", "info", "question", "object", "scene", "observ", "spatial")


def _strip_label(text: str) -> str:
    match = _POINT_LABEL.match(text)
    if match and any(w in match.group(1).lower() for w in _LABEL_WORDS):
        return text[match.end():]
    return text


def _ordered_points(markers: list[re.Match[str]], text: str) -> dict[int, str]:
    """Points 1, 2, 3, ... in order: the first "1", then the first "2" after it, and so on."""
    chosen: list[re.Match[str]] = []
    for m in markers:
        if int(m.group(1)) == len(chosen) + 1:
            chosen.append(m)
    points = {}
    for i, m in enumerate(chosen):
        end = chosen[i + 1].start() if i + 1 < len(chosen) else len(text)
        points[i + 1] = _strip_label(text[m.end():end]).strip().strip("*_ ").strip()
    return points


def numbered_points(text: str) -> dict[int, str]:
    """{1: ..., 2: ..., 3: ...}; {} with fewer than two. Markers at line starts first, then
    anywhere after a space."""
    text = text or ""
    for pattern in (_POINT_AT_LINE, _POINT_INLINE):
        points = _ordered_points(list(pattern.finditer(text)), text)
        if len(points) >= 2:
            return points
    return {}


def _numbered_fields(text: str) -> dict[str, str]:
    points = numbered_points(text)
    if sum(1 for p in points.values() if p) < 2:  # bare markers ("1. 2. 3.") say nothing
        return {}
    fields = {"action": points.get(1, ""), "new_info": points.get(2, "")}
    if points.get(3):
        fields["question_info"] = points[3]
    return fields


def parse_frame_response(text: str, first: bool, reply_format: ReplyFormat = "json") -> FrameInfo:
    """A reply about a first frame (a description) or a pair of frames. Numbered, a first
    frame's whole reply is the description, as the official code reads it."""
    text = text or ""
    fields: dict[str, str] = {}
    parsed_as = "text"
    if reply_format == "numbered":
        if first:
            found = next((f for f in map(_fields_from, _json_objects(text)) if f), None)
            if found is None:  # a description, as asked for
                return FrameInfo(action="", new_info=text.strip(), question_info="", parsed_as="text")
            return FrameInfo("", found.get("new_info", ""), found.get("question_info", ""), "json")
        fields = _numbered_fields(text)
        parsed_as = "numbered" if fields else "text"
    if not fields:
        for obj in _json_objects(text):
            found = _fields_from(obj)
            if found:
                fields, parsed_as = found, "json"
                break
    if not fields:
        fields = _fields_from(_loose_pairs(text))
        parsed_as = "partial_json" if fields else "text"
    if not fields:
        fields = _labelled(text)
        parsed_as = "labels" if fields else "text"
    if not fields and not first:
        fields = _numbered_fields(text)
        parsed_as = "numbered" if fields else "text"
    if not fields:
        fields = {"new_info": text.strip()}
    action = "" if first else normalize_action(fields.get("action", ""))
    return FrameInfo(action, fields.get("new_info", ""), fields.get("question_info", ""), parsed_as)


_FRAME_KEY = re.compile(r"^\s*(?:frame|key ?frame)?[\s_\-#]*(\d+)\s*$", re.IGNORECASE)
_FRAME_LINE = re.compile(r"^[\s>*#\-]*(?:key ?)?frame[\s_#]*(\d+)\s*\**\s*[:\-.)]\s*\**\s*(.*)$", re.IGNORECASE)


def _by_frame(pairs: dict[str, Any], frames: range) -> dict[int, str]:
    out: dict[int, str] = {}
    for key, value in pairs.items():
        match = _FRAME_KEY.match(str(key))
        if match and int(match.group(1)) in frames and int(match.group(1)) not in out:
            out[int(match.group(1))] = _as_text(value).strip()
    return out


def parse_question_pass(text: str, frames: range) -> tuple[dict[int, str], str]:
    """Question-related text per key frame, and how it was read: JSON keyed by frame (or a
    list under ``frames``), else ``Frame 3: ...`` lines, else the whole text on the first frame."""
    text = text or ""
    for obj in _json_objects(text):
        listed = obj.get("frames")
        if isinstance(listed, list) and len(listed) == len(frames):
            return {f: _as_text(v).strip() for f, v in zip(frames, listed)}, "json"
        found = _by_frame(obj, frames)
        if found:
            return found, "json"
    found = _by_frame(_loose_pairs(text), frames)
    if found:
        return found, "partial_json"
    lines: dict[int, list[str]] = {}
    current: int | None = None
    for line in text.splitlines():
        match = _FRAME_LINE.match(line)
        if match and int(match.group(1)) in frames:
            current = int(match.group(1))
            lines.setdefault(current, []).append(match.group(2).strip(" *"))
        elif current is not None and line.strip():
            lines[current].append(line.strip())
    if lines:
        return {f: " ".join(v).strip() for f, v in lines.items()}, "labels"
    # Unstructured prose still bears on the question; it is kept rather than dropped.
    return ({frames[0]: text.strip()} if text.strip() else {}), "text"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip()


def observation(new_info: str, question_info: str, question_label: str = "") -> str:
    parts = [_one_line(new_info)]
    if _one_line(question_info):
        label = question_label.strip()
        parts.append(f"{label} {_one_line(question_info)}" if label else _one_line(question_info))
    return " ".join(p for p in parts if p)


def video_text(frames: list[FrameInfo], question_label: str = "") -> str:
    lines = []
    for i, frame in enumerate(frames):
        seen = observation(frame.new_info, frame.question_info, question_label)
        if i == 0:
            lines.append(f"Frame 0: Observe: {seen}")
        else:
            lines.append(f"Frame {i}: After {frame.action or UNKNOWN_ACTION}, Observe: {seen}")
    return "\n".join(lines)
