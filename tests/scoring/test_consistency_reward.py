"""The consistency reward's edges: options bound the letters both sides may name, grouping by
record, what is logged and counted on every path, and who closes the reference."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from embodied_r.backends.base import BackendConfig, Generation
from embodied_r.backends.factory import make_backend
from embodied_r.scoring.rewards import (
    ConsistencyReward,
    accuracy_reward,
    consistency_ratio,
    make_consistency_reward,
    reference_for_rank,
)
from tests.servers import ScriptedReference
from tests.scoring.test_rewards import OPTIONS, QUESTION, Raising, _extra_kwargs, _trl_kwargs

LOGGER = "embodied_r.scoring.rewards"


class Replying:
    """A reference that gives fixed replies, in order, and says whether it was closed."""

    def __init__(self, *texts: str, errors: tuple[int, ...] = ()):
        self.texts = texts
        self.errors = errors
        self.closed = False

    def generate(self, conversations: list[Any], **kwargs: Any) -> list[Generation]:
        return [Generation(text="", error="HTTP 400: refused") if i in self.errors else Generation(text=t)
                for i, t in enumerate(self.texts)]

    def close(self) -> None:
        self.closed = True


def choice_kwargs(n: int, **extra: Any) -> dict[str, Any]:
    return _trl_kwargs(n, solution=["C"] * n, answer_type=["choice"] * n, options=[OPTIONS] * n,
                       question=[QUESTION] * n, **extra)


def test_a_letter_beyond_the_options_is_no_answer_for_either_side(reference: ScriptedReference) -> None:
    reward = make_consistency_reward(reference.backend(), require_correct=False)
    kwargs, columns = _extra_kwargs(2, solution=["C"] * 2, answer_type=["choice"] * 2, options=[OPTIONS] * 2,
                                    question=[QUESTION] * 2)
    # The policy names E of four options: not read, so the reference is not asked. The
    # reference names E: not read either, so it agrees with nobody.
    out = reward(completions=["<think>REF=E</think><answer>E</answer>", "<think>REF=E</think><answer>C</answer>"],
                 **kwargs)
    reward.close()
    assert out == [0.0, 0.0] and len(reference.bodies) == 1
    assert columns["reference_answer"] == [None, None]


def test_an_empty_answer_type_is_a_choice(reference: ScriptedReference) -> None:
    reward = make_consistency_reward(reference.backend())
    kwargs = _trl_kwargs(2, solution=["C"] * 2, answer_type=[None, ""], options=[OPTIONS] * 2,
                         question=[QUESTION] * 2)
    assert reward(completions=["<think>REF=C</think><answer>C</answer>"] * 2, **kwargs) == [1.0, 1.0]
    reward.close()


def test_the_default_asks_only_about_right_answers() -> None:
    replying = Replying("C")
    reward = ConsistencyReward(replying)
    assert reward(completions=["<think>x</think><answer>A</answer>"], **choice_kwargs(1)) == [0.0]
    assert reward.calls == 0


def test_a_reply_wrapped_in_tags_is_read_inside_them_and_an_unreadable_one_is_none() -> None:
    reward = make_consistency_reward(Replying("<think>it is ahead</think><answer>C</answer>", "maybe"))
    kwargs, columns = _extra_kwargs(2, solution=["C"] * 2, answer_type=["choice"] * 2, options=[OPTIONS] * 2,
                                    question=[QUESTION] * 2)
    assert reward(completions=["<think>x</think><answer>C</answer>"] * 2, **kwargs) == [1.0, 0.0]
    assert columns["reference_answer"] == ["C", None]


def test_unscored_completions_are_filled_within_their_record(reference: ScriptedReference) -> None:
    reward = make_consistency_reward(reference.backend(), fill_unscored=True)
    texts = ["<think>REF=C</think><answer>C</answer>", "<think>REF=FAIL</think><answer>C</answer>",
             "<think>REF=A</think><answer>C</answer>", "<think>REF=FAIL</think><answer>C</answer>"]
    # One prompt text for all four, two records: the records, not the prompts, are the groups.
    out = reward(completions=texts, **choice_kwargs(4, uid=["u1", "u1", "u2", "u2"]))
    reward.close()
    assert out == [1.0, 1.0, 0.0, 0.0]


def test_a_failed_call_leaves_the_following_ones_scored(caplog: pytest.LogCaptureFixture) -> None:
    reward = make_consistency_reward(Replying("", "C", "", "A", errors=(0, 2)))
    kwargs = choice_kwargs(4)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = reward(completions=["<think>x</think><answer>C</answer>"] * 4, **kwargs)
    assert out == [None, 1.0, None, 0.0]
    assert caplog.messages == ["consistency reward: 2 of 4 reference calls failed; left unscored"]
    metrics = kwargs["_metrics"]
    assert metrics["consistency/reference_failed"] == [2.0]
    assert metrics["consistency/skipped"] == [2.0] and metrics["consistency/skipped_ratio"] == [0.5]


def test_skips_are_logged_on_every_path(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing to ask (and an empty call): nothing skipped, but still logged.
    reward = make_consistency_reward(Raising())
    kwargs = choice_kwargs(2)
    reward(completions=["no reasoning", "<think>x</think><answer>A</answer>"], **kwargs)
    empty = _trl_kwargs(0, solution=[], question=[])
    assert reward(completions=[], **empty) == []
    assert kwargs["_metrics"]["consistency/skipped"] == [0.0] and empty["_metrics"]["consistency/skipped"] == [0.0]
    assert kwargs["_metrics"]["consistency/skipped_ratio"] == [0.0]
    assert empty["_metrics"]["consistency/skipped_ratio"] == [0.0]

    # The reference raises: everything unscored, and said so.
    kwargs = choice_kwargs(2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert reward(completions=["<think>x</think><answer>C</answer>"] * 2, **kwargs) == [None, None]
    assert caplog.messages == ["consistency reward: reference model failed (reference went away); "
                               "rewards left unscored"]
    assert kwargs["_metrics"]["consistency/reference_unreachable"] == [1.0]
    assert kwargs["_metrics"]["consistency/skipped"] == [2.0]
    assert kwargs["_metrics"]["consistency/skipped_ratio"] == [1.0]

    # The reference answers the wrong number of questions: the same.
    caplog.clear()
    reward = make_consistency_reward(Replying("C"))
    kwargs = choice_kwargs(2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert reward(completions=["<think>x</think><answer>C</answer>"] * 2, **kwargs) == [None, None]
    assert caplog.messages == ["consistency reward: reference model unreachable (wrong number of replies); "
                               "rewards left unscored"]
    assert kwargs["_metrics"]["consistency/reference_unreachable"] == [1.0]
    assert kwargs["_metrics"]["consistency/skipped"] == [2.0]


def test_calls_are_counted() -> None:
    reward = make_consistency_reward(Replying("C"))
    for _ in range(3):
        reward(completions=["<think>x</think><answer>C</answer>"], **choice_kwargs(1))
    assert reward.calls == 3


def test_close_ends_only_the_reference_the_reward_built(reference: ScriptedReference) -> None:
    given = Replying("C")
    make_consistency_reward(given).close()
    assert not given.closed  # its owner closes it

    reward = make_consistency_reward(reference.backend())
    reward.close()  # never built: nothing to close
    assert reward._backend is None
    assert reward(completions=["<think>REF=C</think><answer>C</answer>"], **choice_kwargs(1)) == [1.0]
    assert reward._backend is not None
    reward.close()
    assert reward._backend is None
    # Built again when used again.
    assert reward(completions=["<think>REF=C</think><answer>C</answer>"], **choice_kwargs(1)) == [1.0]
    reward.close()


def test_the_missing_question_column_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"^consistency_reward needs the dataset column 'question' \(question "
                                         r"with its options, without the video text\); rebuild the records with "
                                         r"embodied_r\.training\.records$"):
        make_consistency_reward(Raising())(completions=["<think>a</think><answer>C</answer>"], solution=["C"])


def test_columns_given_once_apply_to_every_completion_and_wrong_lengths_are_refused() -> None:
    texts = ["<think>x</think><answer>C</answer>", "<think>x</think><answer>B</answer>"]
    assert accuracy_reward(completions=texts, solution="C") == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"^column 'answer_type' has 3 values for 2 completions$"):
        accuracy_reward(completions=texts, solution=["C", "C"], answer_type=["choice"] * 3)


def test_consistency_ratio_judges_readable_answers_only(reference: ScriptedReference) -> None:
    backend = make_backend(reference.backend())
    completions = ["<think>REF=E</think><answer>E</answer>",  # not one of the options: not judged
                   "<think>REF=C</think><answer>A or C</answer>",  # reasoning, but no single answer
                   "<think>REF=3.1</think><answer>3</answer>",  # a number, agreeing within 5 %
                   "<think>REF=C</think><answer>C</answer>"]
    kinds = ["choice", "choice", "number", "choice"]
    options = [OPTIONS, OPTIONS, None, OPTIONS]
    ratio, verdicts = consistency_ratio(backend, completions, [QUESTION] * 4, kinds, options)
    assert verdicts == [None, None, True, True] and ratio == 1.0
    assert len(reference.bodies) == 2  # only the readable answers were put to the reference

    # Without options any letter counts; with nothing judged there is no ratio.
    ratio, verdicts = consistency_ratio(backend, ["<think>REF=E</think><answer>E</answer>"], [QUESTION], ["choice"])
    assert (ratio, verdicts) == (1.0, [True])
    assert consistency_ratio(backend, ["no reasoning"], [QUESTION], ["choice"]) == (None, [None])
    backend.close()


def test_an_http_reference_shares_its_concurrency_among_the_ranks() -> None:
    hosted = BackendConfig(kind="openai", model="m", base_url="http://127.0.0.1:1/v1", concurrency=10)
    assert reference_for_rank(hosted, 1) is hosted
    assert reference_for_rank(hosted, 2).concurrency == 5
    assert reference_for_rank(hosted, 4).concurrency == 2  # whole requests: 10 // 4
    assert reference_for_rank(hosted, 20).concurrency == 1  # at least one each
    local = BackendConfig(kind="transformers", model="m", concurrency=10)
    assert reference_for_rank(local, 8) is local
