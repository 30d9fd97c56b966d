"""Chat about one video: its key frames described once, guided by ``focus`` or else by the first
question (perception in the paper is question-guided), then questions answered by the reasoner
with earlier turns as context; the history saved on every way out."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from embodied_r.scoring.answers import extract_answer, extract_think
from embodied_r.backends.base import Backend, BackendConfig, Conversation
from embodied_r.backends.factory import make_backend
from embodied_r.apps.inference import (
    keyframe_images,
    video_key,
    parse_question,
    perceive,
    perceiver_backend,
    reasoning_conversation,
)
from embodied_r.io import write_json_atomic
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.perception.config import PerceptionConfig
from embodied_r.perception.modes import Question
from embodied_r.training.records_config import RecordsConfig

QUIT = {"/quit", "/exit", "/q"}
HELP = ("Commands: /video shows the text the reasoner reads, /history the turns so far, "
        "/save writes the history now, /quit ends (Ctrl-D too).")


@dataclass
class Turn:
    question: str
    thinking: str
    answer: str
    raw: str
    formatted: bool  # the reply had both <think> and <answer>
    seconds: float
    error: str | None = None


@dataclass
class ChatSession:
    video: Path
    reasoner: BackendConfig
    perception: PerceptionConfig
    keyframes: KeyframeConfig
    records_cfg: RecordsConfig
    work: Path
    max_history: int = 4
    frames: list[str] = field(default_factory=list)
    focus: str | None = None
    video_text: str | None = None
    turns: list[Turn] = field(default_factory=list)
    _backend: Backend | None = field(default=None, repr=False)

    def extract_frames(self) -> list[str]:
        self.frames = keyframe_images(Path(self.video), Path(self.work) / "frames" / self._key, self.keyframes)
        return self.frames

    @property
    def _key(self) -> str:
        return video_key(Path(self.video).resolve())

    def perceive(self, focus: str) -> str:
        if not self.frames:
            self.extract_frames()
        question = Question(uid="chat", video_id=self._key, text=parse_question(focus).with_options,
                            frames=self.frames)
        backend = perceiver_backend(self.perception)
        try:
            text, error = perceive(backend, [question], self.perception)["chat"]
        finally:
            backend.close()
        if error:
            raise RuntimeError(f"the VLM could not describe the video: {error}")
        self.focus, self.video_text = focus, text
        return text

    def conversation(self, question: str) -> Conversation:
        """System prompt, the last ``max_history`` turns, then the question."""
        current = reasoning_conversation(parse_question(question), self.video_text or "", self.records_cfg)
        history: Conversation = []
        for turn in self.turns[-self.max_history:] if self.max_history else []:
            if turn.error is None:
                history += [{"role": "user", "content": turn.question}, {"role": "assistant", "content": turn.raw}]
        return current[:1] + history + current[1:]

    def ask(self, question: str) -> Turn:
        if self.video_text is None:
            self.perceive(question)
        if self._backend is None:
            self._backend = make_backend(self.reasoner)
        started = time.monotonic()
        gen = self._backend.generate([self.conversation(question)])[0]
        think, answer = extract_think(gen.text), extract_answer(gen.text)
        turn = Turn(question=question, thinking=think or "", answer=answer if answer is not None else gen.text.strip(),
                    raw=gen.text, formatted=think is not None and answer is not None,
                    seconds=round(time.monotonic() - started, 3), error=gen.error)
        self.turns.append(turn)
        return turn

    def to_dict(self) -> dict[str, Any]:
        return {"video": str(Path(self.video).resolve()), "reasoner": self.reasoner.model,
                "perceiver": self.perception.backend.model, "key_frames": len(self.frames), "focus": self.focus,
                "video_text": self.video_text, "turns": [asdict(t) for t in self.turns]}

    def save(self, path: Path) -> Path:
        write_json_atomic(Path(path), self.to_dict())
        return Path(path)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None


def default_history_path(root: Path, video: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / "chats" / f"chat-{Path(video).stem}-{stamp}.json"


class _Style:
    """ANSI styling on a terminal without NO_COLOR."""

    def __init__(self, stream: TextIO):
        self.on = stream.isatty() and not os.environ.get("NO_COLOR")

    def dim(self, text: str) -> str:
        return f"\033[2m{text}\033[0m" if self.on else text

    def bold(self, text: str) -> str:
        return f"\033[1m{text}\033[0m" if self.on else text


def show_turn(turn: Turn, out: TextIO = sys.stdout) -> None:
    style = _Style(out)
    if turn.error:
        print(f"error> the reasoning model failed: {turn.error}", file=out)
        return
    if turn.thinking:
        print(style.dim("thinking>"), file=out)
        for line in turn.thinking.splitlines() or [""]:
            print(style.dim(f"  {line}"), file=out)
    if not turn.formatted:
        print(style.dim("(the reply is not in the <think>/<answer> format: shown whole)"), file=out)
    print(f"{style.bold('answer>')} {turn.answer}", file=out)
    out.flush()


def _read_line(stdin: TextIO, out: TextIO) -> str:
    """One line with its newline; "" at the end."""
    if stdin is sys.stdin and out is sys.stdout:
        try:
            return input("you> ") + "\n"  # line editing where readline is available
        except EOFError:
            return ""
    print("you> ", end="", file=out, flush=True)
    return stdin.readline()


def chat_loop(session: ChatSession, history_path: Path, *, stdin: TextIO = sys.stdin,
              out: TextIO = sys.stdout) -> int:
    print(f"Video: {session.video}", file=out)
    print("Extracting key frames ...", file=out, flush=True)
    session.extract_frames()
    print(f"{len(session.frames)} key frames.", file=out)
    if session.focus:
        print("Describing the video (once) ...", file=out, flush=True)
        session.perceive(session.focus)
    print(HELP, file=out, flush=True)
    try:
        while True:
            try:
                line = _read_line(stdin, out)
            except KeyboardInterrupt:
                print(file=out)
                break
            if not line:  # end of input
                print(file=out)
                break
            question = line.strip()
            if not question:
                continue
            if question in QUIT:
                break
            if question == "/help":
                print(HELP, file=out)
            elif question == "/video":
                print(session.video_text or "(not described yet: ask a question first)", file=out)
            elif question == "/history":
                for i, turn in enumerate(session.turns, 1):
                    print(f"{i}. {turn.question} -> {turn.answer}", file=out)
            elif question == "/save":
                print(f"History saved to {session.save(history_path)}", file=out)
            else:
                if session.video_text is None:
                    print("Describing the video (once) ...", file=out, flush=True)
                try:
                    show_turn(session.ask(question), out)
                except RuntimeError as exc:  # the VLM failed: the next question tries again
                    print(f"error> {exc}", file=out)
    except KeyboardInterrupt:
        print(file=out)
    finally:
        session.close()
        print(f"History saved to {session.save(history_path)}", file=out, flush=True)
    return 0
