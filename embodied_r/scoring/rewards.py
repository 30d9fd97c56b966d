"""The GRPO rewards, in TRL's calling convention: ``f(prompts=..., completions=..., **columns,
log_metric=..., log_extra=...)`` with one entry per completion (a string or chat messages),
returning one float, or None ("not scored"), per completion."""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from embodied_r.scoring.answers import (
    AnswerParser,
    ChoiceParser,
    extract_answer,
    extract_think,
    format_ok,
    official_reward_choice,
    parse_choice,
    parse_number,
    read_choice,
    think_fallback_reward,
)
from embodied_r.backends.base import Backend, BackendConfig, completion_text
from embodied_r.backends.factory import make_backend
from embodied_r.scoring.config import ReferenceDown, ScoringConfig
from embodied_r.scoring.metrics import mean_relative_accuracy, score_answer
from embodied_r.scoring.reference_prompts import (
    REFERENCE_SYSTEM,
    REFERENCE_TEMPLATE_CHOICE,
    REFERENCE_TEMPLATE_NUMBER,
)

log = logging.getLogger(__name__)


def _column(kwargs: dict[str, Any], name: str, n: int, default: Any = None) -> list[Any]:
    values = kwargs.get(name)
    if values is None:
        return [default] * n
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        return [values] * n
    if len(values) != n:
        raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
    return list(values)


def _n_options(options: Any) -> int | None:
    if options is None:
        return None
    try:
        n = len(options)
    except TypeError:
        return None
    return n or None


def _format_scores(completions: list[Any], rule: AnswerParser) -> list[float]:
    return [1.0 if format_ok(completion_text(c), rule) else 0.0 for c in completions]


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return _format_scores(completions, "strict")


def _accuracy_scores(completions: list[Any], solution: list[str], parser: ChoiceParser,
                     kwargs: dict[str, Any]) -> list[float]:
    n = len(completions)
    solutions = _column({"solution": solution}, "solution", n)
    answer_types = _column(kwargs, "answer_type", n, "choice")
    options = _column(kwargs, "options", n)
    scored = [
        score_answer(completion_text(c), s, t or "choice", _n_options(o), choice_parser=parser)
        for c, s, t, o in zip(completions, solutions, answer_types, options)
    ]
    log_extra: Callable[[str, list[Any]], None] | None = kwargs.get("log_extra")
    if log_extra is not None:
        # Columns of the trainer's completions table: what was read, and what was right.
        log_extra("answer", [prediction for prediction, _ in scored])
        log_extra("solution", [str(s) for s in solutions])
    return [score for _, score in scored]


def accuracy_reward(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
    return _accuracy_scores(completions, solution, "strict", kwargs)


def make_format_reward(rule: AnswerParser = "strict") -> Callable[..., list[float]]:
    # Named format_reward whatever the rule, so the logged metrics keep their names.
    if rule == "strict":
        return format_reward

    def official_format(completions: list[Any], **kwargs: Any) -> list[float]:
        return _format_scores(completions, rule)

    official_format.__name__ = "format_reward"
    return official_format


def make_accuracy_reward(parser: AnswerParser = "strict") -> Callable[..., list[float]]:
    if parser == "strict":
        return accuracy_reward

    def official_accuracy(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
        return _accuracy_scores(completions, solution, "official_reward", kwargs)

    official_accuracy.__name__ = "accuracy_reward"
    return official_accuracy


def _policy_answer(text: str, answer_type: str, n_options: int | None,
                   parser: ChoiceParser = "strict") -> str | float | None:
    if answer_type == "number":
        return parse_number(extract_answer(text))
    return read_choice(text, n_options, parser)


def _reference_answer(text: str, answer_type: str, n_options: int | None,
                      parser: ChoiceParser = "strict") -> str | float | None:
    if answer_type != "number" and parser == "official_reward":
        # The official reward reads the reference's reply with its own whole-text scan.
        return official_reward_choice(text)
    # A chatty reference may still wrap its reply in tags; read inside them when it does.
    inner = extract_answer(text)
    reply = inner if inner is not None else text
    if answer_type == "number":
        return parse_number(reply)
    return parse_choice(reply, n_options)


def _agrees(reference: str | float | None, policy: str | float, answer_type: str) -> bool:
    if reference is None:
        return False
    if answer_type == "number":
        # The same number up to VSI-Bench's strictest threshold (5 % relative error).
        return mean_relative_accuracy(reference, policy) == 1.0
    return reference == policy


def fill_unscored(values: list[float | None], groups: list[Any]) -> list[float | None]:
    """Each None replaced by the mean of its group's known values (a group with none keeps None).
    TRL adds the rewards with ``nansum``, so an unknown score would rank a completion like a bad
    one; its group's mean moves it neither above nor below the other completions of its prompt."""
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} values for {len(groups)} group labels")
    known: dict[Any, list[float]] = {}
    for value, group in zip(values, groups):
        if value is not None:
            known.setdefault(group, []).append(value)
    return [
        value if value is not None or group not in known else sum(known[group]) / len(known[group])
        for value, group in zip(values, groups)
    ]


class ConsistencyReward:
    """Does a frozen reference model, reading only the question and the policy's ``<think>``
    (no video text), reach the policy's answer? 1.0 when it does; 0.0 when not, without
    reasoning or a readable answer, or (``require_correct``) for a wrong answer, which is not
    asked. Where the reference could not answer: ``when_down``. With ``fill_unscored`` (the
    trainer's) an unscored completion gets its group's mean (``fill_unscored``)."""

    def __init__(self, backend: Backend | BackendConfig, require_correct: bool = True,
                 fill_unscored: bool = False, parser: ChoiceParser = "strict",
                 when_down: ReferenceDown = "unscored", system: str | None = None,
                 template: str | None = None):
        self.__name__ = "consistency_reward"  # TRL names the logged metrics after it
        self.require_correct = require_correct
        self.fill_unscored = fill_unscored
        self.parser: ChoiceParser = parser
        self.when_down: ReferenceDown = when_down
        self.system = system or REFERENCE_SYSTEM
        self.template = template or REFERENCE_TEMPLATE_CHOICE
        self._cfg = backend if isinstance(backend, BackendConfig) else None
        self._backend: Backend | None = None if isinstance(backend, BackendConfig) else backend
        self.calls = 0  # generate calls made, one per step at most

    @property
    def backend(self) -> Backend:
        # Built on first use: stages that never ask the reference never load it.
        if self._backend is None:
            assert self._cfg is not None
            self._backend = make_backend(self._cfg)
        return self._backend

    def close(self) -> None:
        if self._backend is not None and self._cfg is not None:
            self._backend.close()
            self._backend = None

    def __call__(self, completions: list[Any], solution: list[str], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        solutions = _column({"solution": solution}, "solution", n)
        if kwargs.get("question") is None:
            raise ValueError(
                "consistency_reward needs the dataset column 'question' (question with its "
                "options, without the video text); rebuild the records with embodied_r.training.records"
            )
        questions = _column(kwargs, "question", n)
        answer_types = [t or "choice" for t in _column(kwargs, "answer_type", n, "choice")]
        options = _column(kwargs, "options", n)
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        rewards, replies = self._score([completion_text(c) for c in completions], solutions, questions,
                                       answer_types, options, log_metric)
        log_extra: Callable[[str, list[Any]], None] | None = kwargs.get("log_extra")
        if log_extra is not None:
            # One value per completion on every call keeps the trainer's table rows aligned.
            log_extra("reference_answer", replies)
        if self.fill_unscored:
            # Completions of one prompt share its record's uid (the prompt itself without one).
            groups = _column(kwargs, "uid", n) if kwargs.get("uid") is not None else \
                [repr(p) for p in _column(kwargs, "prompts", n)]
            rewards = fill_unscored(rewards, groups)
        return rewards

    def _score(self, texts: list[str], solutions: list[Any], questions: list[Any], answer_types: list[str],
               options: list[Any], log_metric: Callable[[str, float], None] | None,
               ) -> tuple[list[float | None], list[str | None]]:
        # Rewards, and the reference's parsed answers (None where it was not asked).
        n = len(texts)
        rewards: list[float | None] = [0.0] * n
        replies: list[str | None] = [None] * n
        conversations, policy_answers, thinks = self._questions(texts, solutions, questions, answer_types, options)
        asked = list(policy_answers)
        if log_metric is not None:
            log_metric("consistency/asked", float(len(asked)))
        if not asked:
            self._log_skipped(rewards, log_metric)
            return rewards, replies

        backend = self.backend  # construction errors are config errors: let them raise
        try:
            self.calls += 1
            # The whole step in one call: the backend batches or runs it concurrently.
            generations = backend.generate(conversations)
        except Exception as exc:  # noqa: BLE001 - any failure of the reference is "unknown"
            log.warning("consistency reward: reference model failed (%s); %s", exc, self._down_words())
            down = self._unreachable(rewards, policy_answers, thinks, log_metric)
            return self._log_skipped(down, log_metric), replies
        if len(generations) != len(asked) or all(g.error for g in generations):
            first = next((g.error for g in generations if g.error), "wrong number of replies")
            log.warning("consistency reward: reference model unreachable (%s); %s", first, self._down_words())
            down = self._unreachable(rewards, policy_answers, thinks, log_metric)
            return self._log_skipped(down, log_metric), replies

        failed = 0
        for i, generation in zip(asked, generations):
            if generation.error:
                rewards[i] = self._down_value(thinks[i], policy_answers[i])
                failed += 1
                continue
            reference = _reference_answer(generation.text, answer_types[i], _n_options(options[i]),
                                          self.parser)
            replies[i] = None if reference is None else str(reference)
            rewards[i] = 1.0 if _agrees(reference, policy_answers[i], answer_types[i]) else 0.0
        if failed:
            log.warning("consistency reward: %d of %d reference calls failed; %s", failed, len(asked),
                        self._down_words().removeprefix("rewards "))
        if log_metric is not None:
            log_metric("consistency/reference_failed", float(failed))
        self._log_skipped(rewards, log_metric)
        return rewards, replies

    def _questions(self, texts: list[str], solutions: list[Any], questions: list[Any], answer_types: list[str],
                   options: list[Any]) -> tuple[list[list[dict[str, str]]], dict[int, str | float],
                                                dict[int, tuple[str, str]]]:
        # The conversations to ask, and each asked completion's answer and (reasoning, answer type).
        conversations: list[list[dict[str, str]]] = []
        policy_answers: dict[int, str | float] = {}
        thinks: dict[int, tuple[str, str]] = {}
        for i, text in enumerate(texts):
            think = extract_think(text)
            answer = _policy_answer(text, answer_types[i], _n_options(options[i]), self.parser)
            if not think or answer is None:
                continue
            if self.require_correct:
                _, score = score_answer(text, solutions[i], answer_types[i], _n_options(options[i]),
                                        choice_parser=self.parser)
                if score < 1.0:
                    continue
            template = REFERENCE_TEMPLATE_NUMBER if answer_types[i] == "number" else self.template
            conversations.append([
                {"role": "system", "content": self.system},
                {"role": "user", "content": template.format(question=questions[i], think=think)},
            ])
            policy_answers[i] = answer
            thinks[i] = (think, answer_types[i])
        return conversations, policy_answers, thinks

    @staticmethod
    def _log_skipped(rewards: list[float | None], log_metric: Callable[[str, float], None] | None,
                     ) -> list[float | None]:
        # Logged on every call, so a step's mean is over all its calls (docs/training.md).
        if log_metric is not None:
            skipped = sum(r is None for r in rewards)
            log_metric("consistency/skipped", float(skipped))
            log_metric("consistency/skipped_ratio", skipped / len(rewards) if rewards else 0.0)
        return rewards

    def _down_value(self, asked: tuple[str, str] | None = None, answer: str | float | None = None) -> float | None:
        # Unknown, not wrong: a made-up 0 punishes the policy for the reference's outage, and the
        # policy's own reasoning would grade itself. The official code did both, kept as named values.
        if self.when_down == "think_last_letter" and asked is not None:
            think, answer_type = asked
            return think_fallback_reward(think, answer, answer_type)
        return 0.0 if self.when_down == "zero" else None

    def _down_words(self) -> str:
        return {"unscored": "rewards left unscored", "zero": "rewards scored 0",
                "think_last_letter": "rewards scored from the reasoning's last letter"}[self.when_down]

    def _unreachable(self, rewards: list[float | None], policy_answers: dict[int, str | float],
                     thinks: dict[int, tuple[str, str]],
                     log_metric: Callable[[str, float], None] | None) -> list[float | None]:
        if log_metric is not None:
            log_metric("consistency/reference_unreachable", 1.0)
        if self.when_down == "think_last_letter":
            # Per asked completion; the others keep their 0 (no reasoning, no answer, wrong).
            return [self._down_value(thinks[i], policy_answers[i]) if i in policy_answers else r
                    for i, r in enumerate(rewards)]
        return [self._down_value()] * len(rewards)


def reference_for_rank(cfg: BackendConfig, world_size: int) -> BackendConfig:
    """A served reference's ``concurrency`` bounds all trainer processes together: each gets
    its share (at least 1), or 8 processes x 16 requests would hit a hosted API 128 at a time."""
    if not cfg.served or world_size <= 1:
        return cfg
    return cfg.model_copy(update={"concurrency": max(1, cfg.concurrency // world_size)})


def make_consistency_reward(
    backend_or_cfg: Backend | BackendConfig, require_correct: bool = True, fill_unscored: bool = False,
    scoring: ScoringConfig | None = None,
) -> ConsistencyReward:
    scoring = scoring or ScoringConfig()
    return ConsistencyReward(backend_or_cfg, require_correct=require_correct, fill_unscored=fill_unscored,
                             parser=scoring.choice_parser(), when_down=scoring.consistency_when_reference_down,
                             system=scoring.reference_system, template=scoring.reference_template)


def consistency_ratio(
    backend: Backend, completions: list[str], questions: list[str], answer_types: list[str],
    options: list[Any] | None = None,
) -> tuple[float | None, list[bool | None]]:
    """The paper's "logically consistent" share, for evaluation (correctness not required), and
    the per-item verdicts; None where nothing could be judged."""
    reward = ConsistencyReward(backend, require_correct=False)
    n = len(completions)
    scored = reward(
        completions,
        solution=[""] * n,
        question=questions,
        answer_type=answer_types,
        options=options if options is not None else [None] * n,
    )
    verdicts: list[bool | None] = []
    for text, value, kind, opts in zip(completions, scored, answer_types, options or [None] * n):
        judged = extract_think(text) and _policy_answer(text, kind, _n_options(opts)) is not None
        verdicts.append(None if (value is None or not judged) else value == 1.0)
    judged_values = [v for v in verdicts if v is not None]
    ratio = sum(judged_values) / len(judged_values) if judged_values else None
    return ratio, verdicts
