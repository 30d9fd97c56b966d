"""Answer parsing: the answer is read only from the last <answer> block, and strictly."""

from __future__ import annotations

import pytest

from embodied_r.backends.base import completion_text
from embodied_r.scoring.answers import (
    FORMAT_RE,
    extract_answer,
    extract_think,
    parse_choice,
    parse_number,
)


@pytest.mark.parametrize(
    "text",
    ["C", "C.", "(C)", "C. the red door", "Option C", "option c", "Answer: C", "The answer is C",
     "C) turn left", "[C]", "**C**", "\\boxed{C}", "Ｃ", " c ", "Option: C."],
)
def test_parse_choice_accepts_one_letter(text: str) -> None:
    assert parse_choice(text) == "C"


@pytest.mark.parametrize(
    "text",
    ["A or B", "A, C", "A/B", "A and B", "(A) or (B)", "option A or option B", "A. left\nB. right",
     "", "   ", "none of them", "I think C", "a red door", "Options: A, C", None],
)
def test_parse_choice_rejects_zero_or_several_options(text: str | None) -> None:
    assert parse_choice(text) is None


def test_parse_choice_respects_the_option_count() -> None:
    assert parse_choice("D", n_options=4) == "D"
    assert parse_choice("E", n_options=4) is None
    assert parse_choice("E") == "E"


@pytest.mark.parametrize(
    ("text", "value"),
    [("3.5", 3.5), ("3.5 meters", 3.5), ("3.5m", 3.5), ("3.", 3.0), ("1,200", 1200.0), ("-2", -2.0),
     (".5", 0.5), ("three", 3.0), ("about 12 cm", 12.0), ("２", 2.0)],
)
def test_parse_number(text: str, value: float) -> None:
    assert parse_number(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["2-3", "3 or 4", "1,2", "one or two", "nan", "1e999", "many", "", None])
def test_parse_number_rejects_ambiguous_or_missing(text: str | None) -> None:
    assert parse_number(text) is None


def test_extract_answer_reads_only_the_last_answer_block() -> None:
    text = "<think>Option B is wrong, the answer A is tempting</think><answer>C</answer>"
    assert extract_answer(text) == "C"
    assert extract_answer("<answer>A</answer> then <answer> B </answer>") == "B"
    assert extract_answer("The answer is A.") is None
    assert extract_answer("<answer></answer>") == ""
    assert extract_think(text) == "Option B is wrong, the answer A is tempting"


@pytest.mark.parametrize(
    "text",
    ["<think>x</think><answer>A</answer>", "  <think>x</think>\n\n<answer> A </answer>\n",
     "<think>多步推理 ✓</think><answer>B</answer>"],
)
def test_format_accepts(text: str) -> None:
    assert FORMAT_RE.match(text)


@pytest.mark.parametrize(
    "text",
    ["<think>x</think><answer>A</answer> and more", "<answer>A</answer>", "<think>x</think>",
     "<think></think><answer>A</answer>", "<think>x</think><answer> </answer>",
     "<think>x</think><answer>A</answer><answer>B</answer>",
     "<think>x<think>y</think><answer>A</answer>", "prefix <think>x</think><answer>A</answer>",
     "<answer>A</answer><think>x</think>"],
)
def test_format_rejects(text: str) -> None:
    assert not FORMAT_RE.match(text)


# The regex engine checks for signals as it works, so this bound stops a backtracking match
# and fails the test at once, instead of leaving the run to hang. It is no measurement: a
# linear check does these three matches in well under a second on a loaded machine, and a
# quadratic one needs some 10^11 steps (hours), so the outcome does not depend on the load.
@pytest.mark.timeout(60, method="signal")
def test_format_check_stays_fast_on_very_long_outputs() -> None:
    long = "<think>" + "step " * 100_000 + "</think><answer>A</answer> trailing"
    assert not FORMAT_RE.match(long)
    assert FORMAT_RE.match(long[: -len(" trailing")])
    # A nested tag deep inside: every position is tried against the tag guard once.
    assert not FORMAT_RE.match("<think>" + "step " * 100_000 + "<think></think><answer>A</answer>")


def test_completion_text_takes_strings_and_messages() -> None:
    assert completion_text("abc") == "abc"
    assert completion_text([{"role": "assistant", "content": "abc"}]) == "abc"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert completion_text(parts) == "ab"
    assert completion_text(None) == ""


@pytest.mark.parametrize("text, value", [("3, I think", 3.0), ("1,200, roughly", 1200.0), ("3,4", None)])
def test_parse_number_drops_a_trailing_comma(text: str, value: float | None) -> None:
    assert parse_number(text) == value


# -- the official code's readers, kept as the `official` option ----------------------------

from embodied_r.scoring.answers import (  # noqa: E402
    format_ok,
    official_eval_choice,
    official_reward_choice,
    read_choice,
)


def test_official_reward_parser_misreads_a_letter_in_the_reasoning() -> None:
    text = "<think>Option A. is wrong, the tower is not on the left.</think><answer>B</answer>"
    assert official_reward_choice(text) == "A"  # the official whole-completion scan
    assert read_choice(text, 4, "official_reward") == "A"
    assert read_choice(text, 4, "strict") == "B"  # only the <answer> block


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("<answer>C</answer>", "C"),
        ("<answer>C. back</answer>", "C"),
        ("<think>To answer based on the frames</think><answer>C</answer>", "B"),  # "answer b..." comes first
        ("<think>e.g. the chair</think><answer>C</answer>", "E"),  # "e." is a letter and a dot
        ("<think>x</think><answer>$\\boxed{D}$</answer>", "D"),
        ("<think>first A, then</think><answer>The answer C is right</answer>", "C"),
        ("<think>nothing here</think><answer>none</answer>", None),
    ],
)
def test_official_reward_parser_quirks(text: str, letter: str | None) -> None:
    assert official_reward_choice(text) == letter


def test_official_evaluation_parser() -> None:
    # The first letter right after <answer>, else the last "X." anywhere, else nothing.
    assert official_eval_choice("<think>Option A. is wrong</think><answer>B</answer>") == "B"
    assert official_eval_choice("<think>x</think><answer>Based on it, C</answer>") == "B"
    assert official_eval_choice("<think>I pick C. Final.</think>") == "C"
    assert official_eval_choice("<think>I pick C</think>") is None


def test_official_format_rule() -> None:
    ok = "<think>x</think>\n<answer>A</answer>"
    assert format_ok(ok, "official") and format_ok(ok, "strict")
    assert not format_ok(ok + "\n", "official") and format_ok(ok + "\n", "strict")  # nothing after </answer>
    assert not format_ok(" " + ok, "official") and format_ok(" " + ok, "strict")  # nothing before <think>
    assert format_ok("<think></think><answer></answer>", "official")
    assert not format_ok("<think></think><answer></answer>", "strict")  # empty blocks
    with pytest.raises(ValueError):
        format_ok(ok, "lenient")  # type: ignore[arg-type]
