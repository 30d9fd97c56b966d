"""What each synthetic video truly shows, frame by frame (``world_truth.parquet``), and what
decides each question's answer (``question_facts.parquet``: quoted by the warm start's traces,
never put in a prompt), written beside the videos."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import pyarrow as pa

from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.synthetic.world import HFOV, Pose, Segment, Thing, in_view, inside, wrap180

TRUTH_FILE = "world_truth.parquet"

WORLD_TRUTH = pa.schema(
    [
        ("video_id", pa.string()),  # as the catalog names the video
        ("frame_index", pa.int64()),
        ("time", pa.float64()),
        ("yaw", pa.float64()),  # degrees, clockwise seen from above
        ("pitch", pa.float64()),
        ("zoom", pa.float64()),
        ("motion", pa.string()),  # world.MOTIONS: the segment under way at this frame
        ("objects", pa.list_(pa.string())),  # centre in view, left to right
        ("x", pa.list_(pa.float64())),  # place across the frame, 0 (left edge) .. 1 (right edge)
        ("bearing", pa.list_(pa.float64())),  # degrees from the heading, right positive
        ("distance", pa.list_(pa.float64())),  # metres from the camera; NaN outdoors
    ]
)

# What decides a question's answer, by kind; ``objects`` names the things it is about.
FACT_KINDS = {
    "place_now": "where the named object is in the last frame that shows it",
    "last_action": "the movement between the last two frames",
    "actions": "the movements the frames report, in order",
    "turn_to": "the turn that first brought the named object into view",
    "first_seen": "the frame in which each named object first shows",
    "positions": "where each named object stands when it first shows (distance and bearing)",
}
FACTS_FILE = "question_facts.parquet"
QUESTION_FACTS = pa.schema(
    [
        ("question_id", pa.string()),  # the benchmark's own id (Question_id, id)
        ("kind", pa.string()),  # FACT_KINDS
        ("objects", pa.list_(pa.string())),
    ]
)


def side(x: float) -> str:
    """The third of the frame a thing is in; the question writers and the perceiver share it."""
    return "left" if x < 1 / 3 else "right" if x > 2 / 3 else "ahead"


def frame_x(thing: Thing, pose: Pose) -> float:
    return 0.5 + wrap180(thing.azimuth - pose.yaw) * pose.zoom / HFOV


def motion_at(segments: Sequence[Segment], t: float) -> str:
    for s in segments:
        if s.start <= t < s.end:
            return s.action
    return "hover"


def video_truth(video_id: str, things: Sequence[Thing], segments: Sequence[Segment],
                pose_fn: Callable[[float], Pose], n_frames: int, fps: float, aspect: float,
                camera: tuple[float, float] | None = None) -> list[dict]:
    """``WORLD_TRUTH`` rows; ``camera``: the room position a scan turns on, for distances."""
    rows = []
    for f in range(n_frames):
        t = f / fps
        pose = inside(pose_fn(t), aspect)
        shown = sorted((frame_x(o, pose), o) for o in things if in_view(o, pose, aspect))
        rows.append({
            "video_id": video_id, "frame_index": f, "time": t, "yaw": pose.yaw, "pitch": pose.pitch,
            "zoom": pose.zoom, "motion": motion_at(segments, t),
            "objects": [o.name for _, o in shown], "x": [x for x, _ in shown],
            "bearing": [wrap180(o.azimuth - pose.yaw) for _, o in shown],
            "distance": [math.hypot(o.x - camera[0], o.y - camera[1]) if camera else math.nan for _, o in shown],
        })
    return rows


def fact(question_id: object, kind: str, objects: Sequence[str] = ()) -> dict:
    if kind not in FACT_KINDS:
        raise ValueError(f"unknown fact kind {kind!r}; kinds are {', '.join(FACT_KINDS)}")
    return {"question_id": str(question_id), "kind": kind, "objects": list(objects)}


def write_facts(rows: list[dict], folder: Path) -> Path:
    path = Path(folder) / FACTS_FILE
    write_parquet_atomic(table_from_records(rows, QUESTION_FACTS), path)
    return path


def write_truth(rows: list[dict], folder: Path) -> Path:
    path = Path(folder) / TRUTH_FILE
    write_parquet_atomic(table_from_records(rows, WORLD_TRUTH), path)
    return path
