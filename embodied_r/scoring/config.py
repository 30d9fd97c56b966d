"""How the training rewards read completions: the named options a run records."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from embodied_r.scoring.answers import AnswerParser, ChoiceParser

ReferenceDown = Literal["unscored", "zero", "think_last_letter"]
# How numeric answers are read: "official" as VSI-Bench's scorer, "lenient" as the training reward.
NumberParsing = Literal["official", "lenient"]


class ScoringConfig(BaseModel):
    """How the training rewards read completions; each choice is a named option a run
    records. ``strict``/``unscored`` are this project's; ``official``, ``zero`` and
    ``think_last_letter`` the official code's."""

    model_config = ConfigDict(extra="forbid")

    # Option letters: "strict" only inside the last <answer> block, exactly one option;
    # "official" the official reward's scan of the whole completion, reasoning included
    # (it reads "Option A. is wrong ... <answer>B</answer>" as A).
    answer_parser: AnswerParser = "strict"
    # The format reward: "strict" (non-empty blocks, no repeated tags, whitespace around
    # allowed) or "official" (ms-swift's `format`: nothing before <think>, nothing after
    # </answer>, not even a newline).
    format_rule: AnswerParser = "strict"
    # The consistency reward when the reference model cannot be reached: "unscored" (None:
    # unknown is not wrong), "zero" (the official API reward's 0, `train_8GPUs.sh`) or
    # "think_last_letter" (the official local reward's fallback, `train_5GPUs.sh`: the letter
    # its patterns find last in the policy's own <think> text stands in for the reference's
    # answer; ``answers.official_think_choice``).
    consistency_when_reference_down: ReferenceDown = "unscored"
    # The reference's system message and its template for multiple-choice questions
    # ({question}, {think}), set from the recipe's prompts file; None: this project's.
    reference_system: str | None = None
    reference_template: str | None = None

    def choice_parser(self) -> ChoiceParser:
        return "official_reward" if self.answer_parser == "official" else "strict"
