"""``consistency_when_reference_down: think_last_letter``: the official local reward's fallback,
where the letter read from the policy's own reasoning stands in for the reference's answer."""

from __future__ import annotations

import logging

import pytest

from embodied_r.config import load_recipe
from embodied_r.scoring.answers import official_think_choice, think_fallback_reward
from embodied_r.scoring.config import ScoringConfig
from embodied_r.scoring.rewards import make_consistency_reward
from tests.scoring.test_consistency_reward import LOGGER, Replying, choice_kwargs
from tests.scoring.test_rewards import Raising

FALLBACK = ScoringConfig(answer_parser="official", consistency_when_reference_down="think_last_letter")


@pytest.mark.parametrize("think, letter", [
    # The last match of the first pattern that matches, in the official order.
    (r"maybe $\boxed{B}$, no: $\boxed{D}$ then C.", "D"),
    ("the answer B. then answer C", "C"),
    ("B. is close but C. is closer, see A", "C"),
    ("ahead of b the door, then c", "C"),
    # The article counts: it is the last standalone letter.
    ("the door is ahead, so it is a door", "A"),
    # No letter pattern: a conclusion phrase.
    ("nothing to go on here", None),
    ("", None),
])
def test_the_official_think_letter(think: str, letter: str | None) -> None:
    assert official_think_choice(think) == letter


def test_the_fallback_reward_compares_the_letter_with_the_policy_answer() -> None:
    assert think_fallback_reward("so it is C.", "C") == 1.0
    assert think_fallback_reward("so it is C, not a wall", "C") == 0.0  # the article comes last
    assert think_fallback_reward("no letter here", "C") == 0.0
    assert think_fallback_reward("about 3 m, C.", 3.0, "number") == 0.0


def test_a_failed_reference_call_is_scored_from_the_reasoning(caplog: pytest.LogCaptureFixture) -> None:
    reward = make_consistency_reward(Replying("", "C", "", errors=(0, 2)), scoring=FALLBACK)
    completions = ["<think>it is C.</think><answer>C</answer>", "<think>C.</think><answer>C</answer>",
                   "<think>it is B, not</think><answer>C</answer>"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert reward(completions=completions, **choice_kwargs(3)) == [1.0, 1.0, 0.0]
    assert caplog.messages == ["consistency reward: 2 of 3 reference calls failed; scored from the "
                               "reasoning's last letter"]


def test_an_unreachable_reference_scores_only_the_asked_completions_from_the_reasoning() -> None:
    reward = make_consistency_reward(Raising(), scoring=FALLBACK)
    completions = ["<think>it is C.</think><answer>C</answer>",  # right, and its reasoning ends on C
                   "<think>it is A.</think><answer>A</answer>",  # wrong: never asked, 0
                   "<think>it is D, not</think><answer>C</answer>"]  # right, the reasoning says D
    assert reward(completions=completions, **choice_kwargs(3)) == [1.0, 0.0, 0.0]


def test_the_recipes_take_the_reward_their_script_had() -> None:
    down = {name: load_recipe(name).training.scoring.consistency_when_reference_down
            for name in ("paper", "paper-5gpu", "official-script-5gpu", "paper-8gpu", "official-script",
                         "improved", "demo")}
    assert down == {"paper": "think_last_letter", "paper-5gpu": "think_last_letter",
                    "official-script-5gpu": "think_last_letter", "paper-8gpu": "zero",
                    "official-script": "zero", "improved": "unscored", "demo": "unscored"}
