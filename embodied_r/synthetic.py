"""A small synthetic benchmark laid out exactly like UrbanVideo-Bench and VSI-Bench.

Each world is a textured 360-degree panorama with coloured, labelled objects drawn at known
bearings. The camera turns (yaw), rises or descends (vertical shift) and flies forward or
backward (zoom), so consecutive frames are related by a homography, as the key-frame rule
assumes. Every answer is computed from the generator's own camera path, object layout and
per-frame visibility, so it is right by construction. The benchmark proves the plumbing of
the pipeline, not the science.
"""

from __future__ import annotations

import itertools
import math
import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from embodied_r import schemas
from embodied_r.io import table_from_records, write_parquet_atomic

HFOV = 60.0  # horizontal field of view at zoom 1, degrees
VSPAN = 90.0  # vertical extent of the panorama, degrees
LETTERS = "ABCDEFGH"
URBAN_DIR, VSI_DIR = "UrbanVideo-Bench", "VSI-Bench"
VSI_DATASETS = ("arkitscenes", "scannet", "scannetpp")
PAPER_URBAN_TASKS = ("Landmark Position", "Counterfactual", "Progress Evaluation", "Action Generation")

BGR = {"red": (30, 30, 220), "blue": (200, 90, 20), "green": (40, 170, 40), "yellow": (30, 220, 240),
       "purple": (170, 40, 150), "orange": (20, 130, 250), "white": (245, 245, 245),
       "cyan": (220, 220, 30), "pink": (180, 105, 255), "black": (25, 25, 25)}
URBAN_THINGS = [("red", "cube"), ("blue", "cylinder"), ("green", "sphere"), ("yellow", "cone"),
                ("purple", "cube"), ("orange", "cylinder"), ("white", "sphere"), ("cyan", "cone")]
# VSI-style categories: (name, colour, shape, typical longest dimension in cm)
VSI_THINGS = [("chair", "red", "cube", (75, 100)), ("table", "pink", "box", (120, 180)),
              ("sofa", "blue", "box", (180, 240)), ("tv", "black", "panel", (90, 140)),
              ("bed", "white", "box", (190, 210)), ("lamp", "yellow", "cone", (40, 160)),
              ("plant", "green", "sphere", (40, 120)), ("door", "orange", "panel", (200, 210)),
              ("cabinet", "purple", "cube", (80, 200)), ("toilet", "cyan", "cylinder", (65, 75))]
MOTIONS = ("fly forward", "fly backward", "turn left", "turn right", "rise", "descend", "hover")
AG_OPTION = {"rise": "I rise.", "descend": "I descend.", "fly forward": "I fly forward.",
             "fly backward": "I fly backward.", "turn left": "I turn left.", "turn right": "I turn right."}
AG_DISTRACTORS = ["I rotate the camera upward.", "I rotate the camera downward."]
ACTION_NOUN = {"rise": "ascent", "descend": "descent", "fly forward": "forward flight",
               "fly backward": "backward flight", "turn left": "turn to the left",
               "turn right": "turn to the right"}


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


@dataclass(frozen=True)
class Segment:
    action: str  # one of MOTIONS
    start: float
    duration: float
    rate: float  # deg/s for turns and vertical moves, zoom factor per second for flying

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True)
class Pose:
    yaw: float  # degrees, clockwise seen from above
    pitch: float
    zoom: float


@dataclass
class Thing:
    name: str
    colour: str
    shape: str
    azimuth: float  # degrees, clockwise from north
    elevation: float
    size: float  # angular size, degrees
    x: float = 0.0  # room position in metres (VSI scenes)
    y: float = 0.0
    size_cm: int = 0


def segments_from(motions: Sequence[tuple[str, float, float]]) -> list[Segment]:
    segs, t = [], 0.0
    for action, duration, rate in motions:
        if action not in MOTIONS:
            raise ValueError(f"unknown motion {action!r}; use one of {MOTIONS}")
        segs.append(Segment(action, t, float(duration), float(rate)))
        t += duration
    return segs


def pose_at(segments: Sequence[Segment], t: float, start: Pose = Pose(0.0, 0.0, 1.0)) -> Pose:
    yaw, pitch, zoom = start.yaw, start.pitch, start.zoom
    for s in segments:
        dt = min(max(t - s.start, 0.0), s.duration)
        if dt <= 0.0:
            break
        sign = {"turn right": 1, "turn left": -1, "rise": 1, "descend": -1,
                "fly forward": 1, "fly backward": -1}.get(s.action, 0)
        if s.action.startswith("turn"):
            yaw += sign * s.rate * dt
        elif s.action in ("rise", "descend"):
            pitch += sign * s.rate * dt
        elif s.action.startswith("fly"):
            zoom *= s.rate ** (sign * dt)
    return Pose(yaw % 360.0, pitch, zoom)


def _inside(pose: Pose, aspect: float) -> Pose:
    """Keep the view inside the panorama; plans stay well within, this only guards."""
    zoom = min(max(pose.zoom, 0.7), 3.0)
    limit = VSPAN / 2 - HFOV * aspect / 2 / zoom - 1.0
    return Pose(pose.yaw, min(max(pose.pitch, -limit), limit), zoom)


def wrap180(angle: float) -> float:
    return (angle + 180.0) % 360.0 - 180.0


def _panorama(rng: np.random.Generator, width: int, indoor: bool) -> np.ndarray:
    ppd = width / HFOV
    pw, ph = round(360 * ppd), round(VSPAN * ppd)
    low = rng.integers(0, 256, (ph // 24 + 2, pw // 24 + 2, 3), dtype=np.uint8)
    pano = cv2.resize(low, (pw, ph), interpolation=cv2.INTER_CUBIC)
    top, bottom = ((190, 200, 215), (100, 110, 115)) if indoor else ((230, 190, 150), (110, 110, 110))
    ramp = np.linspace(0.0, 1.0, ph, dtype=np.float32)[:, None, None]
    base = (1 - ramp) * np.float32(top) + ramp * np.float32(bottom)
    pano = (0.25 * pano + 0.75 * base).astype(np.uint8)
    # Many small sharp-edged patches: corners everywhere so ORB finds features at any view.
    scale = width / 640
    n = pw * ph // 1100
    xs, ys = rng.integers(0, pw, n), rng.integers(0, ph, n)
    ws, hs = rng.integers(3, int(40 * scale) + 4, n), rng.integers(3, int(40 * scale) + 4, n)
    # Muted patches (grey plus a small tint) keep the coloured objects easy to tell apart.
    cols = np.clip(rng.integers(50, 210, (n, 1)) + rng.integers(-25, 26, (n, 3)), 0, 255)
    for x, y, w, h, c in zip(xs.tolist(), ys.tolist(), ws.tolist(), hs.tolist(), cols.tolist()):
        cv2.rectangle(pano, (x, y), (x + w, y + h), c, -1)
    return pano


def _draw(pano: np.ndarray, thing: Thing, ppd: float) -> None:
    pw, ph = pano.shape[1], pano.shape[0]
    s = thing.size * ppd
    col = BGR[thing.colour]
    # Shades stay clear of the other objects' colours, so a colour marks one object only.
    light = tuple(int(c + (255 - c) * 0.4) for c in col)
    dark = tuple(int(c * 0.55) for c in col)
    cy = ph / 2 - thing.elevation * ppd
    for cx in (thing.azimuth * ppd, thing.azimuth * ppd - pw, thing.azimuth * ppd + pw):
        if cx < -2 * s or cx > pw + 2 * s:
            continue

        def pt(dx: float, dy: float) -> tuple[int, int]:
            return int(cx + dx * s), int(cy + dy * s)

        if thing.shape in ("cube", "box", "panel"):
            w, h = {"cube": (0.8, 0.8), "box": (1.5, 0.6), "panel": (1.0, 1.3)}[thing.shape]
            cv2.rectangle(pano, pt(-w / 2, -h / 2), pt(w / 2, h / 2), col, -1)
            if thing.shape != "panel":
                top = np.array([pt(-w / 2, -h / 2), pt(-w / 2 + 0.2, -h / 2 - 0.2),
                                pt(w / 2 + 0.2, -h / 2 - 0.2), pt(w / 2, -h / 2)], np.int32)
                side = np.array([pt(w / 2, -h / 2), pt(w / 2 + 0.2, -h / 2 - 0.2),
                                 pt(w / 2 + 0.2, h / 2 - 0.2), pt(w / 2, h / 2)], np.int32)
                cv2.fillPoly(pano, [top], light)
                cv2.fillPoly(pano, [side], dark)
            else:
                cv2.rectangle(pano, pt(-w / 2 + 0.12, -h / 2 + 0.12), pt(w / 2 - 0.12, h / 2 - 0.12), dark, 2)
            cv2.rectangle(pano, pt(-w / 2, -h / 2), pt(w / 2, h / 2), (0, 0, 0), 2)
        elif thing.shape == "cylinder":
            cv2.rectangle(pano, pt(-0.3, -0.4), pt(0.3, 0.4), col, -1)
            cv2.ellipse(pano, pt(0, 0.4), (int(0.3 * s), int(0.1 * s)), 0, 0, 180, col, -1)
            cv2.ellipse(pano, pt(0, -0.4), (int(0.3 * s), int(0.1 * s)), 0, 0, 360, light, -1)
            cv2.rectangle(pano, pt(-0.3, -0.4), pt(0.3, 0.4), (0, 0, 0), 2)
        elif thing.shape == "sphere":
            cv2.circle(pano, pt(0, 0), int(0.45 * s), col, -1)
            cv2.circle(pano, pt(-0.15, -0.15), int(0.12 * s), light, -1)
            cv2.circle(pano, pt(0, 0), int(0.45 * s), (0, 0, 0), 2)
        else:  # cone
            tri = np.array([pt(0, -0.5), pt(-0.4, 0.4), pt(0.4, 0.4)], np.int32)
            cv2.fillPoly(pano, [tri], col)
            cv2.polylines(pano, [tri], True, (0, 0, 0), 2)
        font = max(0.45, s / 150)
        org = pt(-0.5, 0.75)
        cv2.putText(pano, thing.name, org, cv2.FONT_HERSHEY_SIMPLEX, font, (0, 0, 0), 4, cv2.LINE_AA)
        cv2.putText(pano, thing.name, org, cv2.FONT_HERSHEY_SIMPLEX, font, (255, 255, 255), 1, cv2.LINE_AA)


# Half width and half height of each drawn shape, in units of its size.
EXTENT = {"cube": (0.6, 0.6), "box": (0.95, 0.5), "panel": (0.5, 0.65), "cylinder": (0.3, 0.5),
          "sphere": (0.45, 0.45), "cone": (0.4, 0.5)}


def in_view(thing: Thing, pose: Pose, aspect: float = 0.5625, margin: float = 0.05) -> bool:
    """Whether the object's centre is inside the frame (less a margin) at this pose."""
    x = 0.5 + wrap180(thing.azimuth - pose.yaw) * pose.zoom / HFOV
    y = 0.5 - (thing.elevation - pose.pitch) * pose.zoom / (HFOV * aspect)
    return margin <= x <= 1 - margin and margin <= y <= 1 - margin


def glimpsed(thing: Thing, pose: Pose, aspect: float = 0.5625) -> bool:
    """Whether any part of the object's shape is inside the frame at this pose."""
    ex, ey = EXTENT[thing.shape]
    dx = abs(wrap180(thing.azimuth - pose.yaw)) - ex * thing.size
    dy = abs(thing.elevation - pose.pitch) - ey * thing.size
    return dx * pose.zoom < HFOV / 2 and dy * pose.zoom < HFOV * aspect / 2


def render(pano: np.ndarray, things: Sequence[Thing], pose_fn: Callable[[float], Pose],
           outputs: Sequence[tuple[Path, int]], fps: float, width: int, height: int
           ) -> tuple[list[int | None], list[int | None]]:
    """Render ``max(n)`` frames, writing the first ``n`` to each output (prefix clips).

    Frames are written as they are rendered. Returns, per object, the first frame its centre is
    in view ("seen") and the first frame any part of it is ("glimpsed").
    """
    ppd = width / HFOV
    writers = []
    for path, n in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
        if not w.isOpened():
            raise RuntimeError(f"OpenCV cannot write {path}: its FFmpeg build lacks the mp4v encoder")
        writers.append((w, n))
    first_seen: list[int | None] = [None] * len(things)
    first_glimpse: list[int | None] = [None] * len(things)
    try:
        for f in range(max(n for _, n in outputs)):
            pose = _inside(pose_fn(f / fps), height / width)
            z, cx, cy = pose.zoom, pose.yaw * ppd, pano.shape[0] / 2 - pose.pitch * ppd
            m = np.float32([[z, 0, width / 2 - z * cx], [0, z, height / 2 - z * cy]])
            frame = cv2.warpAffine(pano, m, (width, height), flags=cv2.INTER_LINEAR,
                                   borderMode=cv2.BORDER_WRAP)
            for w, n in writers:
                if f < n:
                    w.write(frame)
            for i, thing in enumerate(things):
                if first_seen[i] is None and in_view(thing, pose, height / width):
                    first_seen[i] = f
                if first_glimpse[i] is None and glimpsed(thing, pose, height / width):
                    first_glimpse[i] = f
    finally:
        for w, _ in writers:
            w.release()
    return first_seen, first_glimpse


def write_motion_video(path: Path, motions: Sequence[tuple[str, float, float]], *, seed: int = 0,
                       width: int = 320, height: int = 180, fps: float = 30.0) -> Path:
    """Write a clip of a random textured world following ``(action, seconds, rate)`` motions."""
    rng = np.random.default_rng(seed)
    segs = segments_from(motions)
    total = sum(s.duration for s in segs)
    pano = _panorama(rng, width, indoor=False)
    render(pano, [], lambda t: pose_at(segs, t), [(Path(path), max(1, round(total * fps)))],
           fps, width, height)
    return Path(path)


def _options(rng: np.random.Generator, correct: str, others: Sequence[str]) -> tuple[list[str], str]:
    opts = [correct, *others]
    order = rng.permutation(len(opts)).tolist()
    shuffled = [opts[i] for i in order]
    return shuffled, LETTERS[shuffled.index(correct)]


def _mcq(question: str, options: Sequence[str], header: str) -> str:
    """The two shapes real MCQ.parquet rows use: navigation tasks say 'choose:'."""
    body = "".join(f"{LETTERS[i]}. {o}  \n" for i, o in enumerate(options)).rstrip("\n")
    if header == "choose":
        return f"Question: {question}  \nchoose:  \n{body}"
    return f"Question: {question}\n\nChoices:  \n{body}"


# --------------------------------------------------------------------- UrbanVideo-style flights
def _flight_plan(rng: np.random.Generator, seconds: float, clips: int) -> list[Segment]:
    shortest = max(2.0, 0.4 * seconds)
    base = ["fly forward", "turn left", "turn right", "rise", "descend", "fly backward"]
    order: list[str] = []
    segs: list[Segment] = []
    t = 0.0
    while t < seconds + 2.5 or sum(1 for s in segs[:-1] if s.end >= shortest) < clips:
        if not order:
            order = [base[i] for i in rng.permutation(len(base))]
            if not segs and not {"turn left", "turn right"} & set(order[:2]):
                turn = next(i for i, a in enumerate(order) if a.startswith("turn"))
                order[1], order[turn] = order[turn], order[1]
            if segs and order[0] == segs[-1].action:
                order.append(order.pop(0))
        action = order.pop(0)
        duration = float(rng.choice([1.0, 1.5, 2.0, 2.5]))
        if action.startswith("turn"):
            rate = float(rng.uniform(12, 25) if rng.random() < 0.5 else rng.uniform(60, 100))
        elif action in ("rise", "descend"):
            rate = float(rng.uniform(3, 5))
        else:
            rate = float(rng.uniform(1.12, 1.25) if action == "fly forward" else rng.uniform(1.08, 1.15))
        segs.append(Segment(action, t, duration, rate))
        t += duration
    return segs


def _clip_ends(segs: list[Segment], seconds: float, clips: int) -> list[int]:
    """Indices of the segments each clip ends with; clips end on segment boundaries."""
    cands = [i for i, s in enumerate(segs[:-1]) if s.end >= max(2.0, 0.4 * seconds)]
    within = [i for i in cands if segs[i].end <= seconds + 1e-9] or cands[:1]
    last = cands.index(within[-1])
    pool = cands[: last + 1] if last + 1 >= clips else cands[:clips]
    picks = np.linspace(0, len(pool) - 1, clips).round().astype(int)
    return [pool[i] for i in picks]


def _step_phrases(segs: list[Segment], landmark: dict[int, Thing]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for i, s in enumerate(segs):
        k = seen.get(s.action, 0)
        seen[s.action] = k + 1
        text = AG_OPTION[s.action][2:-1]
        if i in landmark:
            text += f" toward the {landmark[i].name}"
        elif s.action.startswith("turn"):
            text += " quickly" if s.rate > 45 else " slowly"
        text += ["", " again", " a third time", " a fourth time"][min(k, 3)]
        out.append(f"I {text}.")
    return out


def _urban_scene(rng: np.random.Generator, cfg: SyntheticConfig, prefix: str, clips: int,
                 root: Path, qid: int) -> list[dict]:
    segs = _flight_plan(rng, cfg.seconds, clips)
    pose = lambda t: pose_at(segs, t)  # noqa: E731
    names = [URBAN_THINGS[i] for i in rng.permutation(len(URBAN_THINGS))]
    things: list[Thing] = []
    landmark: dict[int, Thing] = {}

    def free(az: float) -> bool:
        return all(abs(wrap180(az - o.azimuth)) >= 22 for o in things)

    for i, s in enumerate(segs):
        end = pose(s.end)
        if s.action.startswith("turn") and free(end.yaw) and len(things) < 5:
            colour, shape = names[len(things)]
            thing = Thing(f"{colour} {shape}", colour, shape, end.yaw,
                          end.pitch + float(rng.uniform(-3, 3)), float(rng.uniform(8, 12)))
            things.append(thing)
            landmark[i] = thing
    for _ in range(200):
        if len(things) >= 6:
            break
        az = float(rng.uniform(0, 360))
        if free(az):
            colour, shape = names[len(things)]
            things.append(Thing(f"{colour} {shape}", colour, shape, az,
                                float(rng.uniform(-8, 8)), float(rng.uniform(7, 11))))
    target = landmark[max(landmark)] if landmark else things[0]
    ends = _clip_ends(segs, cfg.seconds, clips)
    vids = [f"{prefix}.mp4"] if clips == 1 else [f"{prefix}_{k}.mp4" for k in range(clips)]
    n_frames = [max(2, round(segs[e].end * cfg.fps)) for e in ends]
    pano = _panorama(rng, cfg.width, indoor=False)
    for t in things:
        _draw(pano, t, cfg.width / HFOV)
    seen_at, glimpsed_at = render(pano, things, pose, [(root / "videos" / v, n) for v, n in zip(vids, n_frames)],
                                  cfg.fps, cfg.width, cfg.height)
    steps = _step_phrases(segs, landmark)
    rows: list[dict] = []
    for vid, end, n in zip(vids, ends, n_frames):
        seen = [t.name for t, f in zip(things, seen_at) if f is not None and f < n]
        glimpsed_names = {t.name for t, f in zip(things, glimpsed_at) if f is not None and f < n}
        for cat, question, options, answer, header in _urban_questions(
                rng, cfg, segs, end, things, seen, glimpsed_names, landmark, target, steps):
            rows.append({"Question_id": qid + len(rows), "video_id": vid, "question_category": cat,
                         "question": _mcq(question, options, header), "answer": answer})
    return rows


def _urban_questions(rng: np.random.Generator, cfg: SyntheticConfig, segs: list[Segment], end: int,
                     things: list[Thing], seen: list[str], glimpsed_names: set[str],
                     landmark: dict[int, Thing], target: Thing, steps: list[str]
                     ) -> Iterator[tuple[str, str, list[str], str, str]]:
    """Yield (category, question, options, answer letter, header) for the clip ending with segment ``end``."""
    k = cfg.questions_per_category
    done = segs[: end + 1]
    yaw = pose_at(segs, segs[end].end).yaw
    goal = f"At the initial position, you are asked to navigate to the {target.name}."
    # Action Generation: the clip stops on a segment boundary; the next move is the next segment.
    nxt = AG_OPTION[segs[end + 1].action]
    others = [o for o in AG_OPTION.values() if o != nxt] + AG_DISTRACTORS
    opts, ans = _options(rng, nxt, [others[i] for i in rng.permutation(len(others))[:6]])
    yield ("Action Generation", f"{goal} What is your next move, given the target location for "
           "your next move?", opts, ans, "choose")
    # Landmark Position: bearing of a landmark at the end of the clip.
    for thing in [target, *[t for t in things if t is not target]][:k]:
        rel = wrap180(thing.azimuth - yaw)
        side = ("ahead of me" if abs(rel) <= 30 else "behind me" if abs(rel) > 135
                else "on my right" if rel > 0 else "on my left")
        all_sides = ["ahead of me", "on my left", "on my right", "behind me"]
        opts, ans = _options(rng, f"The {thing.name} is {side}.",
                             [f"The {thing.name} is {s}." for s in all_sides if s != side])
        yield ("Landmark Position", f"At the initial position, you are asked to navigate to the "
               f"{thing.name}. When you reach the current location, what is the direction to the "
               "destination?", opts, ans, "choose")
    # Progress Evaluation: which instruction step the last frames belong to.
    instruction = " ".join(s[2].lower() + s[3:] for s in steps)
    wrong = [steps[i] for i in rng.permutation(len(steps)) if i != end][:4]
    opts, ans = _options(rng, steps[end], wrong)
    yield ("Progress Evaluation", f"Navigation Instruction given at initial position: [{instruction}]. "
           "You move according to a series of movement instructions. What are you doing now?",
           opts, ans, "choose")
    # Counterfactual: turning the other way also reaches the landmark; longer or shorter?
    turns = [i for i in range(end + 1) if i in landmark and abs(segs[i].rate * segs[i].duration - 180) > 15]
    for i in turns[:k]:
        s, lm = segs[i], landmark[i].name
        d, other = s.action.split()[1], "right" if s.action == "turn left" else "left"
        angle = s.rate * s.duration
        pre = f"If I turn {other} instead, I"
        longer = f"{pre} can still face the {lm}, but the alternative turn takes longer."
        shorter = f"{pre} can still face the {lm}, and the alternative turn is shorter."
        never = f"{pre} cannot face the {lm}, because it stays out of my view."
        correct = longer if 360 - angle > angle else shorter
        opts, ans = _options(rng, correct, [o for o in (longer, shorter, never) if o != correct])
        yield ("Counterfactual", f"Instead of turning {d} toward the {lm}, if you choose to turn "
               f"{other}, can you still face the {lm}, and how is the alternative route?",
               opts, ans, "choices")
    # Object Recall: clearly seen (centre in view) against never glimpsed; half-seen ones are no option.
    unseen = [f"{c} {s}" for c, s in URBAN_THINGS if f"{c} {s}" not in glimpsed_names]
    for name in [seen[i] for i in rng.permutation(len(seen))][:k]:
        art = lambda n: ("An " if n[0] in "aeiou" else "A ") + n + "."  # noqa: E731
        opts, ans = _options(rng, art(name), [art(unseen[i]) for i in rng.permutation(len(unseen))[:4]])
        yield ("Object Recall", "Which of the following objects do you see during the flight?",
               opts, ans, "choices")
    # Duration: two movements that occur once each in the clip.
    counts: dict[str, int] = {}
    for s in done:
        counts[s.action] = counts.get(s.action, 0) + 1
    single = [s for s in done if counts[s.action] == 1]
    pairs = list(itertools.combinations(single, 2))
    for j in rng.permutation(len(pairs))[:k].tolist():
        a, b = pairs[j]
        na, nb = ACTION_NOUN[a.action], ACTION_NOUN[b.action]
        first_longer = f"My {na} takes longer than my {nb}."
        second_longer = f"My {nb} takes longer than my {na}."
        same = f"My {na} takes the same time as my {nb}."
        correct = same if a.duration == b.duration else first_longer if a.duration > b.duration else second_longer
        opts, ans = _options(rng, correct, [o for o in (first_longer, second_longer, same) if o != correct])
        yield ("Duration", f"Which takes longer, your {na} or your {nb}?", opts, ans, "choices")


# --------------------------------------------------------------------- VSI-style room scans
def _room(rng: np.random.Generator) -> tuple[float, float, tuple[float, float], list[Thing]]:
    length, width = round(float(rng.uniform(4, 8)), 1), round(float(rng.uniform(3, 6)), 1)
    cam = (length / 2 + float(rng.uniform(-0.4, 0.4)), width / 2 + float(rng.uniform(-0.4, 0.4)))
    pool = [VSI_THINGS[0]] * int(rng.integers(2, 5)) + [VSI_THINGS[i] for i in 1 + rng.permutation(9)[:6]]
    things: list[Thing] = []
    for name, colour, shape, (lo, hi) in pool:
        for _ in range(300):
            x, y = float(rng.uniform(0.3, length - 0.3)), float(rng.uniform(0.3, width - 0.3))
            d = math.hypot(x - cam[0], y - cam[1])
            az = math.degrees(math.atan2(x - cam[0], y - cam[1])) % 360
            size = min(13.0, max(6.0, 16.0 / d))
            # Apart on the panorama too, so no object hides another.
            if d >= 1.0 and all(math.hypot(x - o.x, y - o.y) >= 0.7 and abs(wrap180(az - o.azimuth))
                                >= EXTENT[shape][0] * size + EXTENT[o.shape][0] * o.size + 2 for o in things):
                things.append(Thing(name, colour, shape, az, float(rng.uniform(-9, 4)), size, x, y,
                                    int(rng.integers(lo, hi + 1))))
                break
    return length, width, cam, things


def _room_scan(rng: np.random.Generator, seconds: float) -> list[Segment]:
    """A full turn (about 380 degrees) at uneven speeds, broken by short flights and tilts."""
    others = [("fly forward", 1.2), ("fly backward", 1.15), ("rise", 4.0), ("descend", 4.0), ("hover", 0.0)]
    breaks = [others[i] for i in rng.permutation(len(others))[:3]]
    still = [round(float(rng.uniform(0.08, 0.12)) * seconds, 1) for _ in breaks]
    turn_time = seconds - sum(still)
    shares = rng.dirichlet(np.ones(4)) * 0.6 + 0.1
    durations = shares / shares.sum() * turn_time
    weights = durations * rng.uniform(0.4, 2.0, 4)
    angles = weights / weights.sum() * 380.0
    action = "turn right" if rng.random() < 0.5 else "turn left"
    motions: list[tuple[str, float, float]] = []
    for i in range(4):
        motions.append((action, float(durations[i]), float(angles[i] / durations[i])))
        if i < 3:
            motions.append((breaks[i][0], still[i], breaks[i][1]))
    return segments_from(motions)


def _turn_class(rel: float) -> str:
    return "Turn Back" if abs(rel) > 135 else "Turn Right" if rel > 0 else "Turn Left"


def _vsi_questions(rng: np.random.Generator, cfg: SyntheticConfig, dims: tuple[float, float],
                   things: list[Thing], glimpsed_at: list[int | None]
                   ) -> Iterator[tuple[str, str, list[str] | None, str]]:
    """Yield (question_type, question, options or None, ground_truth)."""
    length, width = dims
    k = cfg.questions_per_category
    single = [t for t in things if sum(o.name == t.name for o in things) == 1]
    dist = lambda a, b: math.hypot(a.x - b.x, a.y - b.y)  # noqa: E731
    bearing = lambda a, b: math.degrees(math.atan2(b.x - a.x, b.y - a.y))  # noqa: E731
    rel = lambda a, b, c: wrap180(bearing(a, c) - bearing(a, b))  # noqa: E731
    # The repeated category first, so counting is not always "1".
    names = sorted({t.name for t in things}, key=lambda n: (-sum(t.name == n for t in things), n))
    for name in names[:1] + [names[1:][i] for i in rng.permutation(len(names) - 1)][: k - 1]:
        yield "object_counting", f"How many {name}(s) are in this room?", None, str(sum(t.name == name for t in things))
    # Random draws of four distinct single-instance objects; questions keep the clear-cut ones.
    trios = [tuple(single[i] for i in rng.permutation(len(single))[:4]) for _ in range(40)] if len(single) >= 4 else []
    for a, b, *_ in trios[:k]:
        yield ("object_abs_distance", "Measuring from the closest point of each object, what is the "
               f"direct distance between the {a.name} and the {b.name} (in meters)?", None, f"{dist(a, b):.1f}")
    for a, *_ in trios[:k]:
        yield ("object_size_estimation", "What is the length of the longest dimension (length, width, "
               f"or height) of the {a.name}, measured in centimeters?", None, str(a.size_cm))
    yield ("room_size_estimation", "What is the size of this room (in square meters)? If multiple rooms "
           "are shown, estimate the size of the combined space.", None, f"{length * width:.1f}")
    made = dict.fromkeys(["object_rel_distance", "object_rel_direction_easy", "object_rel_direction_medium",
                          "object_rel_direction_hard", "route_planning"], 0)
    for a, b, c, d in trios:
        cands = [b, c, d] + [t for t in single if t not in (a, b, c, d)][:1]
        ds = sorted(dist(a, t) for t in cands)
        if made["object_rel_distance"] < k and len(cands) == 4 and ds[1] - ds[0] >= 0.3:
            made["object_rel_distance"] += 1
            best = min(cands, key=lambda t: dist(a, t))
            yield ("object_rel_distance", "Measuring from the closest point of each object, which of these "
                   f"objects ({', '.join(t.name for t in cands)}) is the closest to the {a.name}?",
                   [f"{LETTERS[i]}. {t.name}" for i, t in enumerate(cands)], LETTERS[cands.index(best)])
        r = rel(a, b, c)
        stand = f"If I am standing by the {a.name} and facing the {b.name}, "
        if made["object_rel_direction_easy"] < k and 20 <= abs(r) <= 160:
            made["object_rel_direction_easy"] += 1
            opts, ans = _options(rng, "right" if r > 0 else "left", ["left" if r > 0 else "right"])
            yield ("object_rel_direction_easy", stand + f"is the {c.name} to the left or the right of the "
                   f"{b.name}?", [f"{LETTERS[i]}. {o}" for i, o in enumerate(opts)], ans)
        if made["object_rel_direction_medium"] < k and 20 <= abs(r) and abs(abs(r) - 135) >= 10:
            made["object_rel_direction_medium"] += 1
            side = "back" if abs(r) > 135 else "right" if r > 0 else "left"
            opts, ans = _options(rng, side, [s for s in ("left", "right", "back") if s != side])
            yield ("object_rel_direction_medium", stand + f"is the {c.name} to my left, right, or back? An "
                   "object is to my back if I would have to turn at least 135 degrees in order to face it.",
                   [f"{LETTERS[i]}. {o}" for i, o in enumerate(opts)], ans)
        if made["object_rel_direction_hard"] < k and min(abs(r), 180 - abs(r), abs(abs(r) - 90)) >= 10:
            made["object_rel_direction_hard"] += 1
            quad = ("front" if abs(r) < 90 else "back") + ("-right" if r > 0 else "-left")
            opts, ans = _options(rng, quad, [q for q in ("front-left", "front-right", "back-left", "back-right")
                                             if q != quad])
            yield ("object_rel_direction_hard", stand + f"is the {c.name} to my front-left, front-right, "
                   "back-left, or back-right? The directions refer to the quadrants of a Cartesian plane (if "
                   "I am standing at the origin and facing along the positive y-axis).",
                   [f"{LETTERS[i]}. {o}" for i, o in enumerate(opts)], ans)
        r1, r2 = rel(a, b, c), wrap180(bearing(c, d) - bearing(a, c))
        clear = lambda x: 35 <= abs(x) <= 125 or abs(x) >= 150  # noqa: E731
        if made["route_planning"] < k and clear(r1) and clear(r2):
            made["route_planning"] += 1
            right = f"{_turn_class(r1)}, {_turn_class(r2)}"
            combos = [f"{p}, {q}" for p in ("Turn Left", "Turn Right", "Turn Back")
                      for q in ("Turn Left", "Turn Right", "Turn Back") if f"{p}, {q}" != right]
            opts, ans = _options(rng, right, [combos[i] for i in rng.permutation(len(combos))[:3]])
            yield ("route_planning", f"You are a robot beginning at the {a.name} facing the {b.name}. You "
                   f"want to navigate to the {d.name}. You will perform the following actions (Note: for each "
                   "[please fill in], choose either 'turn back,' 'turn left,' or 'turn right.'): 1. [please "
                   f"fill in]. 2. Go forward until the {c.name}. 3. [please fill in]. 4. Go forward until the "
                   f"{d.name}. You have reached the final destination.",
                   [f"{LETTERS[i]}. {o}" for i, o in enumerate(opts)], ans)
    # Appearance order: when any part first shows, for objects that show at clearly different moments.
    order = sorted((f, t.name) for t, f in zip(things, glimpsed_at) if t in single and f is not None)
    spaced = [order[0]] if order else []
    for f, name in order[1:]:
        if f - spaced[-1][0] >= 0.3 * cfg.fps:
            spaced.append((f, name))
    for _ in range(k if len(spaced) >= 4 else 0):
        pick = sorted(spaced[i] for i in rng.permutation(len(spaced))[:4])
        right = [n for _, n in pick]
        perms = [list(p) for p in itertools.permutations(right) if list(p) != right]
        wrong = [", ".join(perms[i]) for i in rng.permutation(len(perms))[:3]]
        opts, ans = _options(rng, ", ".join(right), wrong)
        listed = [right[i] for i in rng.permutation(4)]
        yield ("obj_appearance_order", "What will be the first-time appearance order of the following "
               f"categories in the video: {', '.join(listed)}?",
               [f"{LETTERS[i]}. {o}" for i, o in enumerate(opts)], ans)


def _scene_name(rng: np.random.Generator, dataset: str) -> str:
    if dataset == "arkitscenes":
        return str(41000000 + int(rng.integers(0, 999999)))
    if dataset == "scannet":
        return f"scene{int(rng.integers(0, 800)):04d}_{int(rng.integers(0, 3)):02d}"
    return "".join(rng.choice(list("0123456789abcdef"), 10))


def make_synthetic_benchmark(root: Path, cfg: SyntheticConfig | None = None) -> dict:
    """Write ``root/UrbanVideo-Bench`` and ``root/VSI-Bench`` as the hub repos lay them out."""
    cfg = cfg or SyntheticConfig()
    start = time.perf_counter()
    root = Path(root)
    top = np.random.default_rng([cfg.seed, 7])
    urban_rows: list[dict] = []
    families = ["EmbodiedCity", "AerialVLN", "RealWorld"]
    numbers = (1 + top.permutation(120)).tolist()
    left, scene = cfg.urban_videos, 0
    while left > 0:
        clips = min(cfg.clips_per_scene, left)
        family = families[scene % 3]
        prefix = f"{family}_{numbers[scene % 120]}"
        if family == "AerialVLN":
            prefix += "_" + "".join(top.choice(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"), 30))
        rng = np.random.default_rng([cfg.seed, 1, scene])
        urban_rows += _urban_scene(rng, cfg, prefix, clips, root / URBAN_DIR, len(urban_rows))
        left -= clips
        scene += 1
    write_parquet_atomic(table_from_records(urban_rows, schemas.URBANVIDEO_MCQ), root / URBAN_DIR / "MCQ.parquet")

    vsi_rows: list[dict] = []
    vsi = root / VSI_DIR
    tmp = vsi / ".render"
    vsi.mkdir(parents=True, exist_ok=True)
    zips = {d: zipfile.ZipFile(vsi / f"{d}.zip.tmp", "w", zipfile.ZIP_STORED) for d in VSI_DATASETS}
    used: set[str] = set()
    try:
        for i in range(cfg.vsi_scenes):
            rng = np.random.default_rng([cfg.seed, 2, i])
            dataset = VSI_DATASETS[i % 3]
            name = _scene_name(rng, dataset)
            while name in used:
                name = _scene_name(rng, dataset)
            used.add(name)
            length, width, _, things = _room(rng)
            segs = _room_scan(rng, cfg.seconds)
            start_pose = Pose(float(rng.uniform(0, 360)), 0.0, 1.0)
            pano = _panorama(rng, cfg.width, indoor=True)
            for t in things:
                _draw(pano, t, cfg.width / HFOV)
            video = tmp / f"{dataset}_{name}.mp4"
            _, glimpsed_at = render(pano, things, lambda t: pose_at(segs, t, start_pose),
                                    [(video, round(cfg.seconds * cfg.fps))], cfg.fps, cfg.width, cfg.height)
            zips[dataset].write(video, f"{dataset}/{name}.mp4")
            video.unlink()
            for qtype, question, options, truth in _vsi_questions(rng, cfg, (length, width), things, glimpsed_at):
                vsi_rows.append({"id": len(vsi_rows), "dataset": dataset, "scene_name": name,
                                 "question_type": qtype, "question": question, "options": options,
                                 "ground_truth": truth})
    finally:
        for z in zips.values():
            z.close()
        if tmp.exists():
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    for d in VSI_DATASETS:
        os.replace(vsi / f"{d}.zip.tmp", vsi / f"{d}.zip")
    write_parquet_atomic(table_from_records(vsi_rows, schemas.VSIBENCH), vsi / "test-00000-of-00001.parquet")
    return {"urban_videos": cfg.urban_videos, "urban_scenes": scene, "urban_questions": len(urban_rows),
            "vsi_scenes": cfg.vsi_scenes, "vsi_questions": len(vsi_rows),
            "seconds": round(time.perf_counter() - start, 3)}
