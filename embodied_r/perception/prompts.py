"""Perception prompts (every point of the official ones, in this project's words), the
conversations built from them and their reply schemas. The original texts come only from the
user's checkout (``PerceiverTexts``). Change a prompt, bump ``PROMPT_VERSION``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict

from embodied_r.backends.base import Conversation
from embodied_r.benchmarks.base import question_block

PROMPT_VERSION = "2"

ReplyFormat = Literal["numbered", "json"]
ImageOrder = Literal["text_first", "images_first"]

ACTIONS: tuple[str, ...] = ("move forward", "move backward", "move left", "move right", "move up", "move down",
                            "rotate left", "rotate right", "tilt up", "tilt down")
UNKNOWN_ACTION = "unknown"


class PerceiverTexts(BaseModel):
    """From a prompts file: templates with ``{question}`` (and ``{options}`` in ``question``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    first_frame: str
    pair: str
    question: str
    source: str  # official@<commit>
    sha256: str  # of the prompts file's texts


@dataclass(frozen=True)
class PromptStyle:
    reply_format: ReplyFormat = "numbered"
    image_order: ImageOrder = "text_first"
    system_message: bool = False
    texts: PerceiverTexts | None = None


PAPER_STYLE = PromptStyle()

SYSTEM = (
    "You are the eyes of an embodied agent that explores a scene and sees it through an "
    "egocentric camera. You describe what you see precisely and never answer the question "
    "you are given: another model will answer it from your descriptions."
)

VIEWPOINT = (
    "You see through the camera of an embodied agent: each image shows what the agent sees "
    "from its own point of view."
)
DESCRIBE = (
    "Describe the objects by their colour and shape. First picture the three-dimensional "
    "space around the agent, then say where each thing is relative to the agent itself, "
    'with words such as "ahead", "to the front-left", "to the right", "behind", "above" or '
    '"below", and not where it appears in the picture (not "at the top of the image").'
)
ACTION = (
    "Which one movement did the agent make between the two views? Judge it from how the "
    "objects shifted in view, and give exactly one of: " + ", ".join(ACTIONS) + ", with "
    "nothing else."
)
NEW_INFO = (
    "What spatial information does the second view add to the first: objects that were "
    "hidden, out of view or too unclear to make out before? Many objects of one kind look "
    "alike and repeat (the buildings of a city, for instance), so tell them apart by colour "
    "and shape. " + DESCRIBE
)
QUESTION_OBJECTS = (
    "If anything that the question below or its options name can be seen, describe it and "
    "where it is relative to the agent. Do not answer the question and do not choose an "
    "option: only report whether those things are visible, and where."
)
BRIEF = "Keep the answer short and clear."


def _points(points: list[tuple[str, str]]) -> str:
    return "\n".join(f"{i}. {label}: {text}" for i, (label, text) in enumerate(points, 1))


def _json_reply(fields: dict[str, str]) -> str:
    inner = ", ".join(f'"{k}": "<{v}>"' for k, v in fields.items())
    return "Reply with a JSON object only: {" + inner + "}"


_PAIR_POINTS = [("Action", ACTION), ("New information", NEW_INFO)]
_QUESTION_POINT = ("Question objects", QUESTION_OBJECTS)


def first_frame_instruction(fmt: ReplyFormat) -> str:
    head = f"{VIEWPOINT}\nThis is the first key frame of the video. Describe the scene. {DESCRIBE}\n"
    if fmt == "numbered":
        # A free description, as the official first-frame prompt gets.
        return head + f"{QUESTION_OBJECTS}\n{BRIEF}"
    return head + f"{QUESTION_OBJECTS}\n{BRIEF}\n" + _json_reply(
        {"new_info": "the scene, its objects and where they are",
         "question_info": "the objects the question names, and where they are"})


def pair_instruction(fmt: ReplyFormat) -> str:
    head = (f"{VIEWPOINT}\nThe two images are consecutive key frames of the video: the first "
            "shows the view before a movement, the second the view after it.\n")
    if fmt == "numbered":
        return head + "Reply in three numbered points:\n" + _points(_PAIR_POINTS + [_QUESTION_POINT]) + f"\n{BRIEF}"
    return head + _points(_PAIR_POINTS + [_QUESTION_POINT]) + f"\n{BRIEF}\n" + _json_reply(
        {"action": "one action from the list", "new_info": "the newly seen spatial information",
         "question_info": "the objects the question names, and where they are"})


def scene_instruction(fmt: ReplyFormat) -> str:
    head = f"{VIEWPOINT}\nThis is the first key frame of the video. Describe the scene. {DESCRIBE}\n{BRIEF}"
    if fmt == "numbered":
        return head
    return head + "\n" + _json_reply({"new_info": "the scene, its objects and where they are"})


def video_pair_instruction(fmt: ReplyFormat) -> str:
    head = (f"{VIEWPOINT}\nThe two images are consecutive key frames of the video: the first "
            "shows the view before a movement, the second the view after it.\n")
    if fmt == "numbered":
        return head + "Reply in two numbered points:\n" + _points(_PAIR_POINTS) + f"\n{BRIEF}"
    return head + _points(_PAIR_POINTS) + f"\n{BRIEF}\n" + _json_reply(
        {"action": "one action from the list", "new_info": "the newly seen spatial information"})


QUESTION_PASS = (
    "These are key frames {first} to {last} of an egocentric video, in order: the first "
    "image is frame {first}, the next frame {next}, and so on. They show what an embodied "
    "agent sees from its own point of view.\n"
    "For every frame, say whether anything that the question below or its options name can "
    "be seen in it, with its colour and shape, and where it is relative to the agent "
    '("ahead", "to the front-left", "below"; not where it is in the picture); write "none" '
    "when nothing is. Do not answer the question and do not choose an option.\n"
    "{reply}"
)


def question_pass_instruction(fmt: ReplyFormat, frames: range) -> str:
    if fmt == "numbered":
        reply = 'Reply with one line per frame: "Frame <number>: <what you see>".'
    else:
        example = "{" + ", ".join(f'"{frame_key(f)}": "..."' for f in frames) + "}"
        reply = f"Reply with a JSON object only, one key per frame: {example}"
    return QUESTION_PASS.format(first=frames.start, last=frames[-1], next=frames.start + 1, reply=reply)


def _image(path: str) -> dict[str, str]:
    return {"type": "image", "path": path}


def _conversation(images: list[str], text: str, style: PromptStyle) -> Conversation:
    parts: list[dict[str, str]] = [_image(p) for p in images]
    if style.image_order == "text_first":
        content = [{"type": "text", "text": text}, *parts]
    else:
        # Every question about the same frames shares the longest prefix, which servers cache.
        content = [*parts, {"type": "text", "text": text}]
    system = [{"role": "system", "content": SYSTEM}] if style.system_message else []
    return [*system, {"role": "user", "content": content}]


def _with_question(instruction: str, question: str) -> str:
    return f"{instruction}\n\nQuestion: {question}"


def first_frame_conversation(image: str, question: str, style: PromptStyle = PAPER_STYLE) -> Conversation:
    if style.texts is not None:
        return _conversation([image], style.texts.first_frame.format(question=question), style)
    return _conversation([image], _with_question(first_frame_instruction(style.reply_format), question), style)


def pair_conversation(previous: str, current: str, question: str,
                      style: PromptStyle = PAPER_STYLE) -> Conversation:
    if style.texts is not None:
        return _conversation([previous, current], style.texts.pair.format(question=question), style)
    return _conversation([previous, current], _with_question(pair_instruction(style.reply_format), question), style)


def scene_conversation(image: str, style: PromptStyle = PAPER_STYLE) -> Conversation:
    return _conversation([image], scene_instruction(style.reply_format), style)


def video_pair_conversation(previous: str, current: str, style: PromptStyle = PAPER_STYLE) -> Conversation:
    return _conversation([previous, current], video_pair_instruction(style.reply_format), style)


def frame_key(frame: int) -> str:
    return f"frame_{frame}"


def question_pass_conversation(images: list[str], first: int, question: str,
                               style: PromptStyle = PAPER_STYLE) -> Conversation:
    frames = range(first, first + len(images))
    text = _with_question(question_pass_instruction(style.reply_format, frames), question)
    return _conversation(images, text, style)


def _object_schema(title: str, properties: dict[str, dict[str, Any]]) -> dict[str, Any]:
    # Every key required and no others: what strict structured-output modes accept.
    return {"title": title, "type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


_TEXT = {"type": "string"}
_ACTION = {"type": "string", "enum": list(ACTIONS)}
FIRST_FRAME_SCHEMA = _object_schema("first_frame", {"new_info": _TEXT, "question_info": _TEXT})
PAIR_SCHEMA = _object_schema("frame_pair", {"action": _ACTION, "new_info": _TEXT, "question_info": _TEXT})
SCENE_SCHEMA = _object_schema("scene", {"new_info": _TEXT})
VIDEO_PAIR_SCHEMA = _object_schema("video_pair", {"action": _ACTION, "new_info": _TEXT})


def question_pass_schema(frames: range) -> dict[str, Any]:
    return _object_schema("question_pass", {frame_key(f): _TEXT for f in frames})


def question_with_options(question: str, options: Iterable[str] | None,
                          texts: PerceiverTexts | None = None) -> str:
    if texts is not None:
        return question_block(texts.question, question, options)
    lines = [question.strip()]
    lines += [o.strip() for o in options or [] if o and o.strip()]
    return "\n".join(lines)
