"""The perception modes: which VLM calls a catalog needs and how their replies make each
question's frames. ``per_question`` (the paper): a call per key frame (or pair) per question;
``per_video``: the frames once per video, then a question pass per question (F + Q calls, not
Q x F). Call keys name the item log's lines, so they stay stable across runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from embodied_r.perception import prompts
from embodied_r.backends.base import Conversation
from embodied_r.perception.parse import FrameInfo, parse_frame_response, parse_question_pass
from embodied_r.perception.prompts import PAPER_STYLE, PromptStyle

Mode = Literal["per_question", "per_video"]
# per_video's question passes run after the video passes, with a budget for a whole window.
QUESTION_PHASE = "question"


@dataclass
class Question:
    uid: str
    video_id: str
    text: str  # the question with its option lines
    frames: list[str] = field(default_factory=list)  # absolute key-frame paths, in order


@dataclass(frozen=True)
class Call:
    key: str
    kind: str  # per_question: "frame"; per_video: "scene", "pair" or "question"
    conversation: Conversation
    schema: dict[str, Any] | None  # the reply's JSON schema, for structured output
    needs: tuple[str, ...] = ()


# A failed call's frame under ``on_failure: keep_placeholder``, as the official text renders
# it: "After None, Observe: None".
FAILED_TEXT = "None"
FAILED = "failed"  # parsed_as of such a frame


def placeholder() -> FrameInfo:
    return FrameInfo(FAILED_TEXT, FAILED_TEXT, "", FAILED)


@dataclass
class Assembled:
    infos: list[FrameInfo]
    raws: list[str]  # the reply each frame's action and observation were read from
    keys: list[str]


def windows(n_frames: int, size: int) -> list[range]:
    """Ranges of at most ``size``; a lone last frame joins the one before, so no question
    pass shows a single frame out of context."""
    spans = [range(s, min(s + size, n_frames)) for s in range(0, n_frames, size)]
    if len(spans) > 1 and len(spans[-1]) == 1:
        last = spans.pop()
        spans[-1] = range(spans[-1].start, last.stop)
    return spans


class _Mode:
    def __init__(self, style: PromptStyle = PAPER_STYLE):
        self.style = style

    def _schema(self, schema: dict[str, Any]) -> dict[str, Any] | None:
        return schema if self.style.reply_format == "json" else None


class PerQuestion(_Mode):
    name: Mode = "per_question"

    @staticmethod
    def key(uid: str, frame: int) -> str:
        return f"{uid}:{frame}"

    def calls(self, questions: list[Question]) -> list[Call]:
        out = []
        for q in questions:
            for f in range(len(q.frames)):
                if f == 0:
                    conv = prompts.first_frame_conversation(q.frames[0], q.text, self.style)
                    schema = self._schema(prompts.FIRST_FRAME_SCHEMA)
                else:
                    conv = prompts.pair_conversation(q.frames[f - 1], q.frames[f], q.text, self.style)
                    schema = self._schema(prompts.PAIR_SCHEMA)
                needs = (self.key(q.uid, f - 1),) if f else ()
                out.append((f, q.video_id, q.uid, Call(self.key(q.uid, f), "frame", conv, schema, needs)))
        # Round by round, and within a round video by video: batches of similar length,
        # and questions about the same frames side by side for a server's prefix cache.
        out.sort(key=lambda item: item[:3])
        return [item[3] for item in out]

    def assemble(self, q: Question, done: dict[str, dict[str, Any]],
                 failed: frozenset[str] | set[str] = frozenset()) -> Assembled | str:
        keys = [self.key(q.uid, f) for f in range(len(q.frames))]
        missing = next((k for k in keys if k not in done and k not in failed), None)
        if missing is not None:
            return missing
        raws = [done[k]["raw"] if k in done else "" for k in keys]
        infos = [parse_frame_response(raw, first=f == 0, reply_format=self.style.reply_format)
                 if k in done else placeholder() for f, (k, raw) in enumerate(zip(keys, raws))]
        return Assembled(infos, raws, [k for k in keys if k in done])


class PerVideo(_Mode):
    name: Mode = "per_video"

    def __init__(self, question_window: int, style: PromptStyle = PAPER_STYLE):
        super().__init__(style)
        self.window = question_window

    @staticmethod
    def video_key(video_id: str, frame: int) -> str:
        return f"video:{video_id}:{frame}"

    @staticmethod
    def question_key(uid: str, start: int) -> str:
        return f"question:{uid}:{start}"

    def calls(self, questions: list[Question]) -> list[Call]:
        videos: dict[str, list[str]] = {}
        for q in questions:
            videos.setdefault(q.video_id, q.frames)
        video_calls = []
        for vid, frames in videos.items():
            for f in range(len(frames)):
                if f == 0:
                    call = Call(self.video_key(vid, 0), "scene",
                                prompts.scene_conversation(frames[0], self.style),
                                self._schema(prompts.SCENE_SCHEMA))
                else:
                    call = Call(self.video_key(vid, f), "pair",
                                prompts.video_pair_conversation(frames[f - 1], frames[f], self.style),
                                self._schema(prompts.VIDEO_PAIR_SCHEMA))
                video_calls.append((f, vid, call))
        video_calls.sort(key=lambda item: item[:2])
        question_calls = []
        # Questions of one video together: they share the image prefix of every pass.
        for q in sorted(questions, key=lambda q: (q.video_id, q.uid)):
            for span in windows(len(q.frames), self.window):
                conv = prompts.question_pass_conversation(q.frames[span.start : span.stop], span.start, q.text,
                                                          self.style)
                question_calls.append(Call(self.question_key(q.uid, span.start), QUESTION_PHASE, conv,
                                           self._schema(prompts.question_pass_schema(span)),
                                           needs=tuple(self.video_key(q.video_id, f) for f in range(len(q.frames)))))
        return [c for *_, c in video_calls] + question_calls

    def assemble(self, q: Question, done: dict[str, dict[str, Any]],
                 failed: frozenset[str] | set[str] = frozenset()) -> Assembled | str:
        """A failed question pass leaves its frames without question-related text."""
        spans = windows(len(q.frames), self.window)
        video_keys = [self.video_key(q.video_id, f) for f in range(len(q.frames))]
        question_keys = [self.question_key(q.uid, s.start) for s in spans]
        missing = next((k for k in video_keys + question_keys if k not in done and k not in failed), None)
        if missing is not None:
            return missing
        related: dict[int, str] = {}
        for span, key in zip(spans, question_keys):
            if key in done:
                related.update(parse_question_pass(done[key]["raw"], span)[0])
        raws = [done[k]["raw"] if k in done else "" for k in video_keys]
        infos = []
        for f, (key, raw) in enumerate(zip(video_keys, raws)):
            if key not in done:
                infos.append(placeholder())
                continue
            seen = parse_frame_response(raw, first=f == 0, reply_format=self.style.reply_format)
            infos.append(FrameInfo(seen.action, seen.new_info, related.get(f, ""), seen.parsed_as))
        return Assembled(infos, raws, [k for k in video_keys + question_keys if k in done])


def make_mode(mode: Mode, question_window: int, style: PromptStyle = PAPER_STYLE) -> PerQuestion | PerVideo:
    if mode == "per_question":
        return PerQuestion(style)
    if mode == "per_video":
        return PerVideo(question_window, style)
    raise ValueError(f"unknown perception mode {mode!r} (per_question or per_video)")
