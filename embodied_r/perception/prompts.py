"""Perception prompts, the conversations built from them, and their reply schemas.

``per_question`` (the paper): frame 0 is described alone and each later key frame is
shown with the key frame before it; the perceiver reports the action taken between them,
what is newly visible, and what bears on the question. ``per_video``: the scene and each
pair's action and new information are asked once per video, without a question, and one
question pass per question asks what bears on it in every key frame. Replies are JSON;
backends with structured output are held to the schemas below.

The version is part of every perception stage's identity: change a prompt, bump it.
"""

from __future__ import annotations

from typing import Any, Iterable

from embodied_r.backends.base import Conversation

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

_PAIR_HEAD = (
    "These are two consecutive key frames of the video: the first image is the previous "
    "key frame, the second image is the current one.\n"
    "(1) Which action did the agent take between them? Choose exactly one of: "
    + ", ".join(ACTIONS)
    + ".\n"
    "(2) What spatial information is newly visible in the current frame, relative to the agent?\n"
)

PAIR = (
    _PAIR_HEAD
    + "(3) Which objects related to the question are visible now, and where are they?\n"
    "Do not answer the question.\n"
    'Reply with a JSON object only: {"action": "<one action from the list>", '
    '"new_info": "<newly seen spatial information>", '
    '"question_info": "<question-related objects>"}'
)


# -- per_video mode: the video's own passes, shared by its questions, and one
# question pass per question over all its key frames --------------------------------------

SCENE = (
    "This is the first key frame of the video, seen from the agent's point of view.\n"
    "Describe the scene. Give the spatial relations of the objects relative to the agent "
    "(left, right, ahead, behind, above, below, near, far).\n"
    'Reply with a JSON object only: {"new_info": "<the scene and its spatial relations>"}'
)

VIDEO_PAIR = (
    _PAIR_HEAD
    + 'Reply with a JSON object only: {"action": "<one action from the list>", '
    '"new_info": "<newly seen spatial information>"}'
)

QUESTION_PASS = (
    "These are key frames {first} to {last} of an egocentric video, in order: the first "
    "image is frame {first}, the next frame {next}, and so on.\n"
    "For every frame, say which objects related to the question below are visible in it and "
    'where they are relative to the agent; write "none" when there are none. '
    "Do not answer the question.\n"
    "Reply with a JSON object only, one key per frame: {example}"
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


def scene_conversation(image: str) -> Conversation:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": [_image(image), {"type": "text", "text": SCENE}]},
    ]


def video_pair_conversation(previous: str, current: str) -> Conversation:
    content: list[dict[str, str]] = [_image(previous), _image(current)]
    content.append({"type": "text", "text": VIDEO_PAIR})
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]


def frame_key(frame: int) -> str:
    return f"frame_{frame}"


def question_pass_conversation(images: list[str], first: int, question: str) -> Conversation:
    """Key frames ``first .. first + len(images) - 1`` of one video and one question.
    Every question of a video sees the same images and instruction before its own text,
    so a server's prefix cache serves all but the first."""
    frames = range(first, first + len(images))
    example = "{" + ", ".join(f'"{frame_key(f)}": "..."' for f in frames) + "}"
    instruction = QUESTION_PASS.format(
        first=first, last=frames[-1], next=first + 1, example=example
    )
    return _conversation(images, instruction, question)


# -- structured output: JSON schemas of the replies, for backends that enforce one --------


def _object_schema(title: str, properties: dict[str, dict[str, Any]]) -> dict[str, Any]:
    # Every key required and no others: what strict structured-output modes accept.
    return {
        "title": title,
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


_TEXT = {"type": "string"}
_ACTION = {"type": "string", "enum": list(ACTIONS)}
FIRST_FRAME_SCHEMA = _object_schema("first_frame", {"new_info": _TEXT, "question_info": _TEXT})
PAIR_SCHEMA = _object_schema(
    "frame_pair", {"action": _ACTION, "new_info": _TEXT, "question_info": _TEXT}
)
SCENE_SCHEMA = _object_schema("scene", {"new_info": _TEXT})
VIDEO_PAIR_SCHEMA = _object_schema("video_pair", {"action": _ACTION, "new_info": _TEXT})


def question_pass_schema(frames: range) -> dict[str, Any]:
    return _object_schema("question_pass", {frame_key(f): _TEXT for f in frames})


def question_with_options(question: str, options: Iterable[str] | None) -> str:
    lines = [question.strip()]
    lines += [o.strip() for o in options or [] if o and o.strip()]
    return "\n".join(lines)
