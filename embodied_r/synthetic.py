"""A small synthetic benchmark laid out exactly like UrbanVideo-Bench and VSI-Bench.

Every answer is computed from the generator's own camera path, object layout and per-frame
visibility, so it is right by construction; the same seed gives byte-identical files. The
benchmark proves the plumbing of the pipeline, not the science.

The parts: ``synthetic_world`` (camera paths, objects, rendering), ``synthetic_urban``
(UrbanVideo-style flights and questions) and ``synthetic_vsi`` (VSI-style room scans and
questions). This module holds the configuration and the entry points.
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from embodied_r.synthetic_urban import PAPER_URBAN_TASKS, URBAN_DIR, URBAN_THINGS, write_urban_bench
from embodied_r.synthetic_vsi import VSI_DATASETS, VSI_DIR, VSI_THINGS, write_vsi_bench
from embodied_r.synthetic_world import (BGR, HFOV, MOTIONS, Pose, Segment, Thing, glimpsed, in_view, pose_at,
                                        render, segments_from, write_motion_video)

__all__ = ["BGR", "HFOV", "MOTIONS", "PAPER_URBAN_TASKS", "URBAN_DIR", "URBAN_THINGS", "VSI_DATASETS", "VSI_DIR",
           "VSI_THINGS", "Pose", "Segment", "SyntheticConfig", "Thing", "glimpsed", "in_view",
           "make_synthetic_benchmark", "pose_at", "render", "segments_from", "write_motion_video"]


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


def make_synthetic_benchmark(root: Path, cfg: SyntheticConfig | None = None) -> dict:
    """Write ``root/UrbanVideo-Bench`` and ``root/VSI-Bench`` as the hub repos lay them out."""
    cfg = cfg or SyntheticConfig()
    start = time.perf_counter()
    root = Path(root)
    counts = {**write_urban_bench(root, cfg), **write_vsi_bench(root, cfg)}
    return {**counts, "seconds": round(time.perf_counter() - start, 3)}
