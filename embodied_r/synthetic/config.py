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
    # "fixed": a task with a closed set of answers lists the whole set in one order, so each
    # answer has one letter; options naming objects, routes or orders stay shuffled.
    option_order: Literal["shuffled", "sorted", "fixed"] = "shuffled"
    # Right answers spread evenly over each task's answers: unbalanced, most landmarks stand
    # dead ahead and most turns are short, so "ahead of me" is right without reading the video.
    balanced: bool = False
