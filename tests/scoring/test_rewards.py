"""Reward functions, called the way TRL's GRPOTrainer calls them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from embodied_r.backends.base import BackendConfig, Generation
from embodied_r.backends.factory import make_backend
from embodied_r.scoring.rewards import (
    REFERENCE_SYSTEM,
    REFERENCE_TEMPLATE_CHOICE,
    accuracy_reward,
    consistency_ratio,
    format_reward,
    make_consistency_reward,
)
from tests.servers import ScriptedReference, free_port

QUESTION = "Which way is the red door?\nOptions:\nA. left\nB. right\nC. ahead\nD. behind"
OPTIONS = ["A. left", "B. right", "C. ahead", "D. behind"]

HOSTILE = [
    "<think>Option A is wrong; answer A is tempting.</think><answer>C</answer>",  # letters in thinking
    "<think>x</think><answer>C</answer> P.S. actually A",  # text after </answer>
    "<think>x</think><answer></answer>",  # empty answer
    "<think>x</think><answer>A</answer><answer>C</answer>",  # repeated tags: last one counts
    "<think>hmm</think><answer>A or C</answer>",  # hedging
    "The answer is C.",  # no tags at all
    "<think>路径向前 ✓ — ünïcödé</think><answer>Ｃ</answer>",  # unicode, full-width letter
    "<think>" + "step " * 20_000 + "</think><answer>C</answer>",  # very long
    "",
]


def _trl_kwargs(n: int, **columns: Any) -> dict[str, Any]:
    """The keyword arguments TRL adds to every reward call."""
    metrics: dict[str, list[float]] = {}
    kwargs = {
        "prompts": [[{"role": "user", "content": "q"}]] * n,
        "completion_ids": [[1, 2]] * n,
        "trainer_state": object(),
        "log_extra": lambda column, values: None,
        "log_metric": lambda name, value: metrics.setdefault(name, []).append(value),
        "_metrics": metrics,
    }
    kwargs.update(columns)
    return kwargs


def _as_messages(texts: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "assistant", "content": t}] for t in texts]


def test_format_reward_on_hostile_completions() -> None:
    expected = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert format_reward(completions=HOSTILE, **_trl_kwargs(len(HOSTILE))) == expected
    assert format_reward(completions=_as_messages(HOSTILE), **_trl_kwargs(len(HOSTILE))) == expected


def test_accuracy_reward_reads_only_the_last_answer() -> None:
    n = len(HOSTILE)
    kwargs = _trl_kwargs(n, solution=["C"] * n, answer_type=["choice"] * n, options=[OPTIONS] * n,
                         question=[QUESTION] * n)
    expected = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert accuracy_reward(completions=HOSTILE, **kwargs) == expected
    assert accuracy_reward(completions=_as_messages(HOSTILE), **kwargs) == expected


def test_accuracy_reward_without_type_or_options_scores_letters() -> None:
    """A dataset without ``answer_type`` (or with an empty one) is scored by letter, and
    without ``options`` any letter may be the answer."""
    texts = ["<think>x</think><answer>E</answer>", "<think>x</think><answer>B</answer>"]
    assert accuracy_reward(completions=texts, **_trl_kwargs(2, solution=["E", "E"])) == [1.0, 0.0]
    kwargs = _trl_kwargs(2, solution=["E", "E"], answer_type=[None, ""])
    assert accuracy_reward(completions=texts, **kwargs) == [1.0, 0.0]


def test_accuracy_reward_refuses_a_letter_beyond_the_options() -> None:
    # "E" would be right, but the question has only four options: it names none of them.
    texts = ["<think>x</think><answer>E</answer>", "<think>x</think><answer>D</answer>"]
    kwargs = _trl_kwargs(2, solution=["E", "D"], answer_type=["choice"] * 2, options=[OPTIONS] * 2)
    assert accuracy_reward(completions=texts, **kwargs) == [0.0, 1.0]


def test_accuracy_reward_numbers_use_mean_relative_accuracy() -> None:
    completions = ["<think>x</think><answer>3</answer>", "<think>x</think><answer>2.7</answer>",
                   "<think>x</think><answer>far</answer>"]
    out = accuracy_reward(completions=completions, **_trl_kwargs(3, solution=["3.0"] * 3, answer_type=["number"] * 3))
    assert out[0] == 1.0 and 0.0 < out[1] < 1.0 and out[2] == 0.0


class Recording:
    """A real backend, counting the calls made to it."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.batches: list[int] = []
        self.conversations: list[Any] = []

    def generate(self, conversations: list[Any]) -> list[Generation]:
        self.batches.append(len(conversations))
        self.conversations.extend(conversations)
        return self.backend.generate(conversations)

    def close(self) -> None:
        self.backend.close()


@pytest.fixture(scope="module")
def tiny_reference(tiny_lm_path: Path) -> Any:
    backend = make_backend(BackendConfig(kind="transformers", model=str(tiny_lm_path), device="cpu",
                                         max_new_tokens=6, temperature=0.0))
    yield backend
    backend.close()


def test_consistency_against_a_real_tiny_model(tiny_reference: Any) -> None:
    recording = Recording(tiny_reference)
    reward = make_consistency_reward(recording, require_correct=True)
    assert reward.__name__ == "consistency_reward"
    completions = [
        "<think>The door was on my left, then I turned, so it is ahead.</think><answer>C</answer>",  # correct
        "<think>It is behind me now.</think><answer>D</answer>",  # wrong: not asked
        "<answer>C</answer>",  # no reasoning: not asked
        "<think>Turned twice, it is ahead.</think><answer>C</answer>",  # correct
        "<think>Either way.</think><answer>A or C</answer>",  # no single answer: not asked
    ]
    n = len(completions)
    kwargs = _trl_kwargs(n, solution=["C"] * n, answer_type=["choice"] * n, options=[OPTIONS] * n,
                         question=[QUESTION] * n, uid=[f"q{i}" for i in range(n)])
    out = reward(completions=_as_messages(completions), **kwargs)

    # One batched call, only for the two correct answers with reasoning.
    assert recording.batches == [2]
    assert reward.calls == 1
    # The reference saw the question and the reasoning, never the policy's answer or video text.
    user = recording.conversations[0][1]["content"]
    assert "Which way is the red door?" in user and "then I turned, so it is ahead" in user
    assert "<answer>" not in user and "Frame 0" not in user
    assert recording.conversations[0][0] == {"role": "system", "content": REFERENCE_SYSTEM}

    # Those not asked score 0; what the random-weight reference says decides the others
    # (the exact values against a reference whose answers are known: the tests below).
    assert out[1:3] == [0.0, 0.0] and out[4] == 0.0 and out[0] in (0.0, 1.0) and out[3] in (0.0, 1.0)
    assert kwargs["_metrics"]["consistency/asked"] == [2.0]


def test_consistency_is_one_exactly_when_the_reference_agrees_with_a_right_answer(
        reference: ScriptedReference) -> None:
    reward = make_consistency_reward(reference.backend(), require_correct=True)
    completions = [
        "<think>REF=C it is ahead.</think><answer>C</answer>",  # right, reference agrees: 1
        "<think>REF=A it is ahead.</think><answer>C</answer>",  # right, reference disagrees: 0
        "<think>REF=D</think><answer>D</answer>",  # agrees but wrong: 0, not asked
        "<answer>C</answer>",  # no reasoning: 0, not asked
        "<think>REF=C</think><answer>(C)</answer>",  # read as C: 1
        "<think>REF=c.</think><answer>C</answer>",  # the reference's reply is parsed too: 1
        "<think>REF=FAIL</think><answer>C</answer>",  # the call failed: unknown
    ]
    n = len(completions)
    kwargs, columns = _extra_kwargs(n, solution=["C"] * n, answer_type=["choice"] * n,
                                    options=[OPTIONS] * n, question=[QUESTION] * n)
    out = reward(completions=_as_messages(completions), **kwargs)
    reward.close()
    assert out == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, None]
    assert len(reference.bodies) == 5
    assert columns["reference_answer"] == ["C", "A", None, None, "C", "C", None]
    assert kwargs["_metrics"]["consistency/reference_failed"] == [1.0]


def test_consistency_of_numbers_agrees_within_five_percent(reference: ScriptedReference) -> None:
    reward = make_consistency_reward(reference.backend(), require_correct=True)
    completions = ["<think>REF=3.1</think><answer>3</answer>", "<think>REF=3.4</think><answer>3</answer>"]
    out = reward(completions=completions, **_trl_kwargs(2, solution=["3"] * 2, answer_type=["number"] * 2,
                                                         question=["How far?"] * 2))
    reward.close()
    assert out == [1.0, 0.0]
    assert "give the number" in reference.bodies[0]["messages"][-1]["content"]


def test_consistency_without_correctness_asks_for_wrong_answers_too(reference: ScriptedReference) -> None:
    reward = make_consistency_reward(reference.backend(), require_correct=False)
    completions = ["<think>REF=B</think><answer>C</answer>", "<think>REF=D</think><answer>D</answer>"]
    out = reward(completions=completions, **_trl_kwargs(2, solution=["C", "C"], answer_type=["choice"] * 2,
                                                         options=[OPTIONS] * 2, question=[QUESTION] * 2))
    reward.close()
    # Right but inconsistent: 0; wrong but consistent: 1 (consistency alone is judged).
    assert out == [0.0, 1.0] and len(reference.bodies) == 2


def test_consistency_reference_sees_the_question_and_reasoning_only(reference: ScriptedReference) -> None:
    reward = make_consistency_reward(reference.backend())
    reward(completions=["<think>REF=C turned twice</think><answer>C</answer>"],
           **_trl_kwargs(1, solution=["C"], question=[QUESTION], options=[OPTIONS]))
    reward.close()
    messages = reference.bodies[0]["messages"]
    assert messages == [
        {"role": "system", "content": REFERENCE_SYSTEM},
        {"role": "user", "content": (
            "This is a multiple-choice question. Based only on the question and the reasoning below, "
            "choose the one option the reasoning supports.\n\nQuestion:\n" + QUESTION
            + "\n\nReasoning:\nREF=C turned twice\n\nAnswer with the option's letter only, without explanation.")},
    ]
    assert REFERENCE_TEMPLATE_CHOICE.count("{") == 2


def test_fill_unscored_gives_the_groups_known_mean() -> None:
    from embodied_r.scoring.rewards import fill_unscored

    assert fill_unscored([1.0, None, 0.0, 1.0, None, 0.5], ["a", "a", "a", "a", "b", "b"]) == \
        [1.0, pytest.approx(2 / 3), 0.0, 1.0, 0.5, 0.5]
    assert fill_unscored([None, None, 1.0], ["a", "a", "b"]) == [None, None, 1.0]
    assert fill_unscored([0.0, 0.0], ["a", "b"]) == [0.0, 0.0]
    assert fill_unscored([], []) == []
    with pytest.raises(ValueError, match="2 values for 1"):
        fill_unscored([1.0, None], ["a"])


def test_consistency_fills_by_the_prompt_without_a_uid(reference: ScriptedReference) -> None:
    reward = make_consistency_reward(reference.backend(), fill_unscored=True)
    texts = ["<think>REF=C</think><answer>C</answer>", "<think>REF=FAIL</think><answer>C</answer>",
             "<think>REF=A</think><answer>C</answer>", "<think>REF=FAIL</think><answer>C</answer>"]
    kwargs = _trl_kwargs(4, solution=["C"] * 4, question=[QUESTION] * 4, options=[OPTIONS] * 4)
    kwargs["prompts"] = [[{"role": "user", "content": p}] for p in ("p1", "p1", "p2", "p2")]
    out = reward(completions=texts, **kwargs)
    reward.close()
    assert out == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("text", [
    "<think>a</think><answer>C",  # missing </answer>
    "<think>a</think><answer>C</answr>",  # misspelled close tag
    "<think>a</think><answr>C</answr>",  # misspelled tag
    "<thinking>a</thinking><answer>C</answer>",  # another tag name
    "<think>a<answer>C</answer>",  # missing </think>
    "<think>a</think>C</answer>",  # missing <answer>
    "a</think><answer>C</answer>",  # missing <think>
    "<think>a <think>b</think></think><answer>C</answer>",  # nested think
    "<think>a</think><answer><answer>C</answer></answer>",  # nested answer
    "<think>a</think><answer>B</answer><answer>C</answer>",  # repeated answer block
    "<think>a</think><think>b</think><answer>C</answer>",  # repeated think block
    "<think>a</think><answer>C</answer><think>b</think><answer>C</answer>",  # the pair twice
    "<answer>C</answer><think>a</think>",  # wrong order
    "Sure! <think>a</think><answer>C</answer>",  # text before
    "<think>a</think> so <answer>C</answer>",  # text between
    "<THINK>a</THINK><ANSWER>C</ANSWER>",  # other case
    "<think>a</think><answer> </answer>",  # blank answer
])
def test_format_reward_refuses_a_broken_format(text: str) -> None:
    assert format_reward(completions=[text, _as_messages([text])[0]]) == [0.0, 0.0]


@pytest.mark.parametrize("text", [
    "<think>a</think><answer>C</answer>",
    "  <think>\nline one\nline two\n</think>\n\n<answer>C</answer>\n",
    "<think>a < b and b > c</think><answer>C. ahead</answer>",
])
def test_format_reward_accepts_the_format(text: str) -> None:
    assert format_reward(completions=[text, _as_messages([text])[0]]) == [1.0, 1.0]


def test_consistency_unreachable_endpoint_gives_none(caplog: pytest.LogCaptureFixture) -> None:
    cfg = BackendConfig(kind="openai", model="reference", base_url=f"http://127.0.0.1:{free_port()}/v1",
                        max_retries=0, timeout_s=5.0)
    reward = make_consistency_reward(cfg)
    completions = ["<think>ahead</think><answer>C</answer>", "<think>behind</think><answer>D</answer>",
                   "no format"]
    kwargs = _trl_kwargs(3, solution=["C"] * 3, answer_type=["choice"] * 3, options=[OPTIONS] * 3,
                         question=[QUESTION] * 3)
    with caplog.at_level(logging.WARNING, logger="embodied_r.scoring.rewards"):
        out = reward(completions=completions, **kwargs)
    reward.close()
    assert out == [None, None, None]
    assert "unreachable" in caplog.text
    assert kwargs["_metrics"]["consistency/reference_unreachable"] == [1.0]


class Raising:
    """A reference whose every call fails (a crash we cannot cause on a real model)."""

    def generate(self, conversations: list[Any]) -> list[Generation]:
        raise ConnectionError("reference went away")

    def close(self) -> None:
        pass


def test_consistency_raising_backend_gives_none(caplog: pytest.LogCaptureFixture) -> None:
    reward = make_consistency_reward(Raising())
    with caplog.at_level(logging.WARNING, logger="embodied_r.scoring.rewards"):
        out = reward(completions=["<think>a</think><answer>C</answer>"],
                     **_trl_kwargs(1, solution=["C"], question=[QUESTION], options=[OPTIONS]))
    assert out == [None]
    assert "reference went away" in caplog.text


def test_consistency_backend_is_built_lazily_and_only_when_needed(tiny_lm_path: Path) -> None:
    reward = make_consistency_reward(BackendConfig(model=str(tiny_lm_path), device="cpu", max_new_tokens=4))
    assert reward._backend is None
    # Every answer wrong: nobody needs the reference, so it is not even loaded.
    out = reward(completions=["<think>a</think><answer>A</answer>"] * 3,
                 **_trl_kwargs(3, solution=["C"] * 3, question=[QUESTION] * 3, options=[OPTIONS] * 3))
    assert out == [0.0, 0.0, 0.0] and reward._backend is None
    reward(completions=["<think>a</think><answer>C</answer>"],
           **_trl_kwargs(1, solution=["C"], question=[QUESTION], options=[OPTIONS]))
    assert reward._backend is not None
    reward.close()


def test_consistency_needs_the_question_column() -> None:
    reward = make_consistency_reward(Raising())
    with pytest.raises(ValueError, match="question"):
        reward(completions=["<think>a</think><answer>C</answer>"], solution=["C"])


def test_consistency_ratio_counts_agreements_among_the_judged(reference: ScriptedReference) -> None:
    from embodied_r.backends.factory import make_backend

    backend = make_backend(reference.backend())
    completions = ["<think>REF=C</think><answer>C</answer>", "no reasoning", "<think>REF=A</think><answer>B</answer>",
                   "<think>REF=D</think><answer>D</answer>", "<think>REF=FAIL</think><answer>A</answer>"]
    ratio, verdicts = consistency_ratio(backend, completions, [QUESTION] * 5, ["choice"] * 5, [OPTIONS] * 5)
    backend.close()
    assert verdicts == [True, None, False, True, None]
    assert ratio == pytest.approx(2 / 3)


def test_consistency_ratio_over_a_real_tiny_model(tiny_reference: Any) -> None:
    completions = ["<think>ahead</think><answer>C</answer>", "no reasoning", "<think>x</think><answer>B</answer>"]
    ratio, verdicts = consistency_ratio(tiny_reference, completions, [QUESTION] * 3, ["choice"] * 3, [OPTIONS] * 3)
    assert verdicts[1] is None
    assert verdicts[0] in (True, False) and verdicts[2] in (True, False)
    assert ratio == pytest.approx(sum(v for v in verdicts if v is not None) / 2)


def _extra_kwargs(n: int, **columns: Any) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """TRL's keyword arguments with ``log_extra`` recording the table columns."""
    columns_logged: dict[str, list[Any]] = {}
    kwargs = _trl_kwargs(n, **columns)
    kwargs["log_extra"] = lambda column, values: columns_logged.setdefault(column, []).extend(values)
    return kwargs, columns_logged


def test_more_hostile_completions() -> None:
    texts = [
        "<think></think><answer>C</answer>",  # empty reasoning: not the format, answer still read
        "<think>a</think><think>b</think><answer>C</answer>",  # repeated think
        "<think>a <answer>A</answer></think><answer>C</answer>",  # an answer tag nested in thinking
        "<think>a</think>\n<answer>\nOption C\n</answer>\n",  # whitespace around is fine
        "<think>a</think><answer>C. the red door</answer>",
        "<think>a</think><answer>(C)</answer>",
        "<think>a</think><answer>C or maybe D</answer>",  # two options
        "<think>a</think><answer>the answer is C</answer></answer>",  # a stray closing tag after
        "<think>a</think><answer>Ｃ．</answer>",  # full-width letter and dot
    ]
    n = len(texts)
    kwargs, _ = _extra_kwargs(n, solution=["C"] * n, answer_type=["choice"] * n, options=[OPTIONS] * n)
    assert format_reward(completions=texts, **kwargs) == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert accuracy_reward(completions=texts, **kwargs) == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]


def test_numbers_read_only_the_answer() -> None:
    texts = ["<think>it is 5 meters, no, 3</think><answer>about 3 m</answer>",
             "<think>x</think><answer>3 or 4</answer>", "<think>x</think><answer>4.5</answer>"]
    out = accuracy_reward(completions=texts, **_trl_kwargs(3, solution=["3"] * 3, answer_type=["number"] * 3))
    # 4.5 against 3: relative error 0.5 meets only the 0.50 threshold.
    assert out == [1.0, 0.0, pytest.approx(0.1)]


def test_accuracy_logs_the_answer_and_solution_columns() -> None:
    texts = ["<think>x</think><answer>(B)</answer>", "no answer"]
    kwargs, columns = _extra_kwargs(2, solution=["B", "C"], answer_type=["choice"] * 2, options=[OPTIONS] * 2)
    accuracy_reward(completions=texts, **kwargs)
    assert columns == {"answer": ["B", ""], "solution": ["B", "C"]}


def test_consistency_logs_one_reference_answer_per_completion(tiny_reference: Any) -> None:
    """Whether the reference was asked, not needed or unreachable, the column it logs has
    one value per completion, so the trainer's completions table stays aligned."""
    reward = make_consistency_reward(tiny_reference)
    texts = ["<think>ahead</think><answer>C</answer>", "<think>behind</think><answer>D</answer>"]
    kwargs, columns = _extra_kwargs(2, solution=["C", "C"], question=[QUESTION] * 2, options=[OPTIONS] * 2)
    out = reward(completions=texts, **kwargs)
    assert len(columns["reference_answer"]) == 2 and columns["reference_answer"][1] is None
    assert (out[0] == 1.0) == (columns["reference_answer"][0] == "C")

    kwargs, columns = _extra_kwargs(1, solution=["C"], question=[QUESTION], options=[OPTIONS])
    reward(completions=["<think>x</think><answer>A</answer>"], **kwargs)  # wrong: nobody asked
    assert columns == {"reference_answer": [None]}

    kwargs, columns = _extra_kwargs(2, solution=["C", "C"], question=[QUESTION] * 2, options=[OPTIONS] * 2)
    assert make_consistency_reward(Raising())(completions=texts, **kwargs) == [None, None]
    assert columns == {"reference_answer": [None, None]}


def test_numeric_agreement_is_within_five_percent() -> None:
    from embodied_r.scoring.rewards import _agrees

    assert _agrees(3.1, 3.0, "number") and not _agrees(3.3, 3.0, "number")
    assert _agrees("B", "B", "choice") and not _agrees("B", "C", "choice")
    assert not _agrees(None, "C", "choice")


# -- the official readers and the official outage rule, as named options -------------------

from embodied_r.scoring.config import ScoringConfig  # noqa: E402
from embodied_r.scoring.rewards import make_accuracy_reward, make_format_reward  # noqa: E402


class Scripted:
    """A reference that replies with fixed text (or an error) for every conversation."""

    def __init__(self, text: str = "", error: str | None = None):
        self.text, self.error, self.asked = text, error, 0

    def generate(self, conversations: list[Any]) -> list[Generation]:
        self.asked += len(conversations)
        return [Generation(text=self.text, error=self.error) for _ in conversations]

    def close(self) -> None:
        pass


def test_official_accuracy_reads_the_reasoning_strict_does_not() -> None:
    misread = "<think>Option A. is wrong, it is on the right</think><answer>B</answer>"
    kwargs = _trl_kwargs(1, solution=["A"], answer_type=["choice"], options=[OPTIONS])
    official, strict = make_accuracy_reward("official"), make_accuracy_reward("strict")
    assert official.__name__ == strict.__name__ == "accuracy_reward"
    assert official(completions=[misread], **kwargs) == [1.0]  # read as A: rewarded for a wrong answer
    assert strict(completions=[misread], **kwargs) == [0.0]
    assert strict is accuracy_reward


def test_official_format_reward() -> None:
    official = make_format_reward("official")
    assert official.__name__ == "format_reward" and make_format_reward("strict") is format_reward
    texts = ["<think>x</think><answer>A</answer>", "<think>x</think><answer>A</answer>\n"]
    assert official(completions=texts, **_trl_kwargs(2)) == [1.0, 0.0]
    assert format_reward(completions=texts, **_trl_kwargs(2)) == [1.0, 1.0]


def test_consistency_when_the_reference_is_down_is_a_named_option() -> None:
    kwargs = _trl_kwargs(1, solution=["C"], question=[QUESTION], options=[OPTIONS])
    good = ["<think>it is ahead</think><answer>C</answer>"]
    zero = make_consistency_reward(Raising(), scoring=ScoringConfig(consistency_when_reference_down="zero"))
    assert zero(completions=good, **kwargs) == [0.0]
    failing = make_consistency_reward(Scripted(error="HTTP 503"), scoring=ScoringConfig(
        consistency_when_reference_down="zero"))
    assert failing(completions=good, **kwargs) == [0.0]
    assert make_consistency_reward(Raising())(completions=good, **kwargs) == [None]


def test_official_consistency_reads_with_the_official_parser() -> None:
    kwargs = _trl_kwargs(1, solution=["A"], question=[QUESTION], options=[OPTIONS])
    misread = ["<think>Option A. is wrong</think><answer>B</answer>"]
    reference = Scripted("The answer is A.")
    official = make_consistency_reward(reference, scoring=ScoringConfig(answer_parser="official"))
    # The official reading takes the policy's answer as A (correct) and the reference's as A.
    assert official(completions=misread, **kwargs) == [1.0] and reference.asked == 1
    strict_ref = Scripted("A")
    strict = make_consistency_reward(strict_ref)
    assert strict(completions=misread, **kwargs) == [0.0] and strict_ref.asked == 0  # B is wrong: not asked
