"""How the training rewards read completions: named options a run records, ``strict`` and
``unscored`` this project's, the others the official code's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from embodied_r.scoring.answers import AnswerParser, ChoiceParser

ReferenceDown = Literal["unscored", "zero", "think_last_letter"]
# How numeric answers are read: "official" as VSI-Bench's scorer, "lenient" as the training reward.
NumberParsing = Literal["official", "lenient"]


class ScoringConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Option letters: "strict" only inside the last <answer> block, exactly one option;
    # "official" scans the whole completion, reasoning included ("Option A. is wrong ...
    # <answer>B</answer>" reads as A).
    answer_parser: AnswerParser = "strict"
    # "strict": non-empty blocks, no repeated tags, whitespace around allowed; "official":
    # ms-swift's `format`, nothing before <think> or after </answer>, not even a newline.
    format_rule: AnswerParser = "strict"
    # The consistency reward when the reference cannot be reached: "unscored" (None: unknown is
    # not wrong), "zero" (the official API reward, `train_8GPUs.sh`) or "think_last_letter"
    # (the official local reward, `train_5GPUs.sh`: the last letter its patterns find in the
    # policy's own <think> stands in for the reference's answer).
    consistency_when_reference_down: ReferenceDown = "unscored"
    # From the recipe's prompts file ({question}, {think}); None: this project's.
    reference_system: str | None = None
    reference_template: str | None = None

    def choice_parser(self) -> ChoiceParser:
        return "official_reward" if self.answer_parser == "official" else "strict"
