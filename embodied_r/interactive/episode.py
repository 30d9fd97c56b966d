"""The evaluation episode loop as the original runs it, episodes in lockstep to batch the model's calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from embodied_r.interactive import prompts
from embodied_r.interactive.actions import Decision, Matcher, parse_decision
from embodied_r.interactive.environment import Environment
from embodied_r.interactive.metrics import all_metrics
from embodied_r.interactive.config import EpisodeConfig
from embodied_r.interactive.tasks import key_actions, step_limit


@dataclass
class Episode:
    task: dict[str, Any]
    env: Environment
    out: Path
    cfg: EpisodeConfig
    messages: list[dict[str, str]] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    decision: Decision = Decision("init", "init", None)
    previous: tuple[str, str | None] = ("init", None)
    same: int = 0
    steps: int = 0
    idle_calls: int = 0
    steps_before: int = 0
    stop: str = ""
    legal: list[str] = field(default_factory=list)
    match: Matcher | None = None  # None: the string rule at ``cfg.match_threshold``
    dropped: bool = False

    def __post_init__(self) -> None:
        texts = self.cfg.texts
        self.messages = [{"role": "system", "content": texts.system if texts else prompts.SYSTEM}]
        self.limit = self.cfg.step_limit or step_limit(self.task["tasktype"])

    @property
    def done(self) -> bool:
        return bool(self.stop)

    def advance(self) -> bool:
        """Act on the last decision; False when the episode has ended instead."""
        d = self.decision
        if self.stop:
            return False
        if d.verb == "end":
            return self._finish("end")
        if self.steps >= self.limit:
            return self._finish("step_limit")
        if self.idle_calls >= self.cfg.max_idle_calls:
            return self._finish("no_progress")
        if (d.verb, d.obj) == self.previous:
            self.same += 1
            if self.same == self.cfg.max_same_action:
                self.trajectory.append({"action": "end", "object": None, "legal_objects": [], "success": 0})
                self.stop = "repeated_action"
                return False
        else:
            self.same, self.previous = 0, (d.verb, d.obj)
        self.steps_before = self.steps
        if d.verb == "error":
            self.trajectory.append({"action": "error", "object": None, "legal_objects": [], "success": 0})
            texts = self.cfg.texts
            self.messages.append({"role": "user", "content": texts.invalid_action + texts.after_error
                                  if texts else prompts.INVALID})
            return True
        result = self.env.reset(self.task, self.out) if d.verb == "init" else self.env.step(d.verb, d.obj)
        self.steps += 1
        self.legal = result.legal_objects
        self.trajectory.append({"action": d.verb, "object": d.obj, "legal_objects": result.legal_objects,
                                "success": int(result.success), "images": result.images})
        if not result.success:
            self.messages.append({"role": "user", "content": self._failure_turn(d, result.feedback)})
            return True
        self.images += result.images
        self.messages.append({"role": "user", "content": self._turn(d, len(result.images))})
        return True

    def _failure_turn(self, d: Decision, reason: str) -> str:
        if self.cfg.texts is None:
            return prompts.after_failure(d.raw or d.verb, reason, unmatched=d.unmatched is not None)
        return prompts.official_feedback(self.cfg.texts, d.verb, d.obj, d.raw or d.verb, d.unmatched is not None)

    def _turn(self, d: Decision, n: int) -> str:
        action = " ".join(x for x in (d.verb, d.obj) if x)
        texts = self.cfg.texts
        if texts is None:
            return prompts.first_turn(self.task["taskquery"], n) if d.verb == "init" else prompts.after_action(action, n)
        # The original: the turn's images, then its text; "move forward" has its own text.
        if d.verb == "init":
            text = texts.first_turn.format(task_name=self.task["taskquery"])
        elif d.verb == "move forward":
            text = texts.after_move_forward.format(action=d.verb)
        else:
            text = texts.after_action.format(action=action)
        return prompts.IMAGE * n + text

    def feed(self, response: str | None) -> None:
        """Take the model's reply to the turn ``advance`` added; None: the generation failed."""
        if not response and self.cfg.failed_generation == "drop":
            # The original tests the reply for "" alone: a call that failed and an empty reply.
            self.stop, self.dropped = "failed_generation", True
            return
        response = response or ""
        self.idle_calls = 0 if self.steps != self.steps_before else self.idle_calls + 1
        self.decision = parse_decision(response, self.env.object_types(), self.cfg.match_threshold, self.match)
        self.messages.append({"role": "assistant", "content": response})

    def _finish(self, why: str) -> bool:
        self.stop = why
        if self.cfg.always_append_end or why == "end":
            self.trajectory.append({"action": "end", "object": None, "legal_objects": self.legal, "success": 1})
        return False

    def result(self) -> dict[str, Any]:
        keys = key_actions(self.task)
        scored = [{k: v for k, v in s.items() if k != "images"} for s in self.trajectory]
        main, extra = all_metrics(self.task, scored, keys)
        return {"identity": self.task["identity"], "tasktype": self.task["tasktype"], "scene": self.task["scene"],
                "stop": self.stop, "steps": self.steps, "key_actions": keys, "trajectory": scored,
                "dropped": self.dropped, **main, **extra}


def conversation(messages: list[dict[str, str]], images: list[str]) -> list[dict[str, Any]]:
    """ShareGPT messages -> the backends' chat format, each turn's images before its text as the original."""
    out, queue = [], list(images)
    for m in messages:
        n = m["content"].count(prompts.IMAGE)
        if not n:
            out.append({"role": m["role"], "content": m["content"]})
            continue
        parts = [{"type": "image", "path": queue.pop(0)} for _ in range(n)]
        parts.append({"type": "text", "text": m["content"].replace(prompts.IMAGE, "")})
        out.append({"role": m["role"], "content": parts})
    return out


# One reply per conversation; None where the generation failed.
Generate = Callable[[list[list[dict[str, Any]]]], list[str | None]]


def embedding_matcher(cfg: EpisodeConfig) -> Any:
    """The embedding matcher the config names, loaded once for a whole run; None for the string rule."""
    if cfg.matcher != "embedding":
        return None
    from embodied_r.interactive.matching import EmbeddingMatcher

    return EmbeddingMatcher(cfg.embedding_model, cfg.embedding_threshold)


def run_episodes(tasks: list[dict[str, Any]], make_env: Callable[[], Environment], generate: Generate,
                 out: Path, cfg: EpisodeConfig, on_done: Callable[[Episode], None] | None = None,
                 batch: int = 8, match: Any = None) -> list[Episode]:
    """Run every task's episode, ``batch`` at a time in lockstep; ``on_done`` fires per episode.
    ``match`` is a matcher already loaded (``embedding_matcher``); without one it is loaded here."""
    finished: list[Episode] = []
    if match is None and tasks:
        match = embedding_matcher(cfg)
    for start in range(0, len(tasks), batch):
        running = [Episode(t, make_env(), Path(out) / str(t["identity"]), cfg, match=match)
                   for t in tasks[start:start + batch]]
        while running:
            active = [e for e in running if e.advance()]
            for e in running:
                if e.done:
                    e.env.close()
                    finished.append(e)
                    if on_done:
                        on_done(e)
            running = active
            if active:
                replies = generate([conversation(e.messages, e.images) for e in active])
                for e, reply in zip(active, replies):
                    e.feed(reply)
    return finished
