"""Key-frame clips with their truth, for teaching and measuring a perceiver.

A clip is a world of the benchmark's two kinds (an UrbanVideo-style flight outdoors, a
VSI-style room scan indoors), its camera plan, and the frames a caller's key-frame rule
keeps of the views sampled along it. Each frame comes with the objects
whose centre is in view, left to right, and each pair of consecutive frames with the camera
motion that changed the view most between them. Nothing is written to disk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from embodied_r.synthetic.urban import URBAN_THINGS, _flight_plan, place_urban_things
from embodied_r.synthetic.vsi import VSI_THINGS, _room, _room_scan
from embodied_r.synthetic.world import (
    HFOV,
    Pose,
    Segment,
    Thing,
    camera_view,
    draw_thing,
    in_view,
    inside,
    panorama,
    pose_at,
    wrap180,
)

KINDS = ("urban", "room")
URBAN_NAMES = tuple(f"{c} {s}" for c, s in URBAN_THINGS)
ROOM_NAMES = tuple(dict.fromkeys(name for name, *_ in VSI_THINGS))
# Below this much change of view (share of the frame) a pair shows no motion to name.
MIN_EFFECT = 0.04


@dataclass
class Clip:
    kind: str  # "urban" or "room"
    names: list[str]  # every object of the world, for question writers
    frames: list[np.ndarray] = field(default_factory=list)  # BGR key frames
    times: list[float] = field(default_factory=list)
    poses: list[Pose] = field(default_factory=list)  # the camera's, per frame
    visible: list[list[str]] = field(default_factory=list)  # per frame, left to right
    # Per frame after the first: the world motion (``world.MOTIONS``) that changed the view
    # most since the frame before, or None where the view hardly changed.
    motions: list[str | None] = field(default_factory=list)


def _urban_world(rng: np.random.Generator, seconds: float) -> tuple[list[Segment], list[Thing], Pose]:
    """A flight as ``urban`` plans it, objects at the end of turns and elsewhere."""
    segs = _flight_plan(rng, seconds, 1)
    things, _ = place_urban_things(rng, segs)
    return segs, things, Pose(0.0, 0.0, 1.0)


def _room_world(rng: np.random.Generator, seconds: float) -> tuple[list[Segment], list[Thing], Pose]:
    _, _, _, things = _room(rng)
    segs = _room_scan(rng, seconds)
    return segs, things, Pose(float(rng.uniform(0, 360)), 0.0, 1.0)


def view_change(a: Pose, b: Pose, aspect: float) -> dict[str, float]:
    """How much of the frame each kind of motion moved between two poses."""
    return {"turn": abs(wrap180(b.yaw - a.yaw)) / HFOV,
            "vertical": abs(b.pitch - a.pitch) * a.zoom / (HFOV * aspect),
            "fly": abs(math.log(b.zoom / a.zoom))}


def dominant_motion(segs: list[Segment], start: Pose, t0: float, t1: float, aspect: float) -> str | None:
    """The motion whose own part of ``[t0, t1]`` changed the view most."""
    best, effect = None, MIN_EFFECT
    for s in segs:
        lo, hi = max(s.start, t0), min(s.end, t1)
        if hi <= lo or s.action == "hover":
            continue
        change = view_change(pose_at(segs, lo, start), pose_at(segs, hi, start), aspect)
        kind = "turn" if s.action.startswith("turn") else "fly" if s.action.startswith("fly") else "vertical"
        if change[kind] > effect:
            best, effect = s.action, change[kind]
    return best


def make_clips(seed: int, kind: str, chains: int = 1, *, seconds: float = 8.0, width: int = 640,
               height: int = 360, sample_fps: float = 1.0,
               keep: Callable[[list[np.ndarray]], list[int]] | None = None) -> list[Clip]:
    """``chains`` clips of one world of ``kind`` made from ``seed``: the camera's view sampled
    ``sample_fps`` times a second (the first chain from 0 s, the others from a random start)
    and the samples ``keep`` picks as key frames (every sample without it). The key-frame
    stage's own rule is passed in by the caller, which may import it."""
    if kind not in KINDS:
        raise ValueError(f"unknown clip kind {kind!r}; use one of {KINDS}")
    rng = np.random.default_rng([seed, 11, KINDS.index(kind)])
    segs, things, start = (_urban_world if kind == "urban" else _room_world)(rng, seconds)
    pano = panorama(rng, width, indoor=kind == "room")
    for t in things:
        draw_thing(pano, t, width / HFOV)
    aspect = height / width
    end = min(seconds, segs[-1].end)
    clips = []
    for c in range(chains):
        first = float(rng.uniform(0, 1.5)) if c else 0.0
        times = [float(t) for t in np.arange(first, end + 1e-9, 1.0 / sample_fps)]
        poses = [inside(pose_at(segs, t, start), aspect) for t in times]
        frames = [camera_view(pano, pose, width, height) for pose in poses]
        chosen = keep(frames) if keep is not None else list(range(len(frames)))
        clip = Clip(kind, sorted({t.name for t in things}))
        for n, i in enumerate(chosen):
            clip.frames.append(frames[i])
            clip.times.append(times[i])
            clip.poses.append(poses[i])
            shown = sorted((wrap180(o.azimuth - poses[i].yaw), o.name) for o in things if in_view(o, poses[i], aspect))
            clip.visible.append(list(dict.fromkeys(name for _, name in shown)))
            if n:
                clip.motions.append(dominant_motion(segs, start, clip.times[-2], times[i], aspect))
        clips.append(clip)
    return clips
