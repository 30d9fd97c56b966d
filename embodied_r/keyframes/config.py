"""The key-frame stage's config and declaration."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from embodied_r.settings import operational, result_settings
from embodied_r.stage_plan import ITEMS, StageKind


class KeyframeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # "official": the official code's rule, step by step (``keyframes.official``).
    mode: Literal["fast", "official"] = "fast"
    sample_fps: float = Field(1.0, gt=0, le=120, description="frames examined per second of video")
    # 1.0: the key-frame experiment's all-frames baseline, clamped like key frames.
    overlap_threshold: float = Field(0.5, gt=0, le=1, description="keep a frame below this overlap")
    min_frames: int = Field(4, ge=2)
    max_frames: int = Field(32, ge=2)
    orb_features: int = Field(500, ge=50)
    ratio_test: float = Field(0.75, gt=0, le=1, description="Lowe's ratio for knn matches")
    cross_check: bool = Field(False, description="match by cross-check, as the official code")
    min_matches: int = Field(10, ge=4)
    min_inliers: int = Field(8, ge=4, description="fewer RANSAC inliers count as a failed match")
    ransac_reproj_threshold: float = Field(5.0, gt=0, description="pixels of the source frame")
    match_width: int = Field(320, ge=0, description="match at this width; 0 = source width")
    jpeg_max_side: int = Field(640, ge=0, description="longest side of saved frames; 0 = source")
    jpeg_quality: int = Field(90, ge=1, le=100)
    workers: int = operational(0, ge=0, description="video processes; 0 = one per core")
    cv_threads: int = operational(0, ge=0, description="OpenCV threads per process; 0 = its share of the cores")
    decode_threads: int | None = operational(None, ge=0, description="FFmpeg threads per video; 0 = one per "
                                             "core; None = by frame size (video.auto_decode_threads)")
    decode_ahead: int = operational(2, ge=0, description="sampled frames decoded ahead in a second thread; 0 = none")
    cache: bool = operational(True, description="reuse key frames of a video with the same content and parameters")
    cache_dir: str | None = operational(None, description="default: $EMBODIED_R_HOME/cache/keyframes")
    shards: int = operational(1, ge=1, description="parts the videos are split into, each run on its own "
                              "(a flow run of its own with deployments) and merged; 1 = not split")

    @model_validator(mode="after")
    def _bounds(self) -> "KeyframeConfig":
        if self.max_frames < self.min_frames:
            raise ValueError(f"max_frames ({self.max_frames}) must be >= min_frames ({self.min_frames})")
        return self

    def output_params(self) -> dict[str, Any]:
        """The settings that decide which frames are kept and how they are saved."""
        return result_settings(self, mode="python")


KEYFRAMES = StageKind("keyframes", "embodied_r.keyframes.stage:run_stage", "cpu", "extract key frames of every video",
                      section="keyframes", config=KeyframeConfig, inputs={"catalog": "preprocess/catalog.parquet"},
                      retries=1, unit="videos", figures=ITEMS)
