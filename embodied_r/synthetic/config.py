"""Settings of the synthetic benchmark: sizes, seed and video format."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SyntheticConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    urban_videos: int = Field(6, ge=0, description="UrbanVideo-style clips in all")
    clips_per_scene: int = Field(2, ge=1, description="clips cut from one flight (prefixes)")
    vsi_scenes: int = Field(3, ge=0, description="VSI-style room scans, one video each")
    seconds: float = Field(8.0, ge=3.0, le=600.0, description="length of the longest clip")
    fps: float = Field(30.0, gt=0.0, le=120.0)
    width: int = Field(640, ge=64, le=3840)
    height: int = Field(360, ge=36, le=2160)
    questions_per_category: int = Field(1, ge=1, le=5)
    # "shuffled" as the real benchmarks mostly have them; "sorted": each question's options in
    # alphabetical order; "fixed": a task whose options are a closed set (where a landmark
    # is, the next move, which movement is under way, left or right, ...) lists that whole
    # set in one order for every question, so each answer has one letter and a reasoner maps
    # what it read to a letter without looking it up among shuffled lines (the demo's, with
    # ``balanced``). Tasks whose options name objects, routes or orders stay shuffled.
    option_order: Literal["shuffled", "sorted", "fixed"] = "shuffled"
    # Spread the right answers evenly over what each task can answer: landmarks placed to the
    # left, ahead and right of where a turn ends, turns both shorter and longer than half a
    # circle, and each question's subject chosen so that no answer is more often right than
    # the others. Unbalanced, most landmarks stand dead ahead and most turns are short, so
    # "ahead of me" or "the other way is longer" is right without reading the video.
    balanced: bool = False
