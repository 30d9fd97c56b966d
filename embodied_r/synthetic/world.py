"""The synthetic worlds: a 360-degree panorama with labelled objects, camera paths (turns, tilts,
zoom: frames related by a homography, as the key-frame rule assumes), drawing, visibility and
rendering, all from one geometry, so the question writers take answers from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import cv2
import numpy as np

HFOV = 60.0  # horizontal field of view at zoom 1, degrees
VSPAN = 90.0  # vertical extent of the panorama, degrees
LETTERS = "ABCDEFGH"

BGR = {"red": (30, 30, 220), "blue": (200, 90, 20), "green": (40, 170, 40), "yellow": (30, 220, 240),
       "purple": (170, 40, 150), "orange": (20, 130, 250), "white": (245, 245, 245),
       "cyan": (220, 220, 30), "pink": (180, 105, 255), "black": (25, 25, 25)}
MOTIONS = ("fly forward", "fly backward", "turn left", "turn right", "rise", "descend", "hover")


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


def inside(pose: Pose, aspect: float) -> Pose:
    # Plans stay well within the panorama; this only guards.
    zoom = min(max(pose.zoom, 0.7), 3.0)
    limit = VSPAN / 2 - HFOV * aspect / 2 / zoom - 1.0
    return Pose(pose.yaw, min(max(pose.pitch, -limit), limit), zoom)


def wrap180(angle: float) -> float:
    return (angle + 180.0) % 360.0 - 180.0


@dataclass(frozen=True)
class Backdrop:
    """A panorama's random draws, made in one place so it can be painted anywhere (a filming
    worker) and the generator's later draws do not depend on the painting."""

    width: int
    indoor: bool
    low: np.ndarray  # a coarse random image, upscaled into the background's texture
    patches: np.ndarray  # one row per patch: x, y, w, h, b, g, r


def backdrop(rng: np.random.Generator, width: int, indoor: bool) -> Backdrop:
    ppd = width / HFOV
    pw, ph = round(360 * ppd), round(VSPAN * ppd)
    low = rng.integers(0, 256, (ph // 24 + 2, pw // 24 + 2, 3), dtype=np.uint8)
    scale = width / 640
    n = pw * ph // 1100
    xs, ys = rng.integers(0, pw, n), rng.integers(0, ph, n)
    ws, hs = rng.integers(3, int(40 * scale) + 4, n), rng.integers(3, int(40 * scale) + 4, n)
    # Muted patches (grey plus a small tint) keep the coloured objects easy to tell apart.
    cols = np.clip(rng.integers(50, 210, (n, 1)) + rng.integers(-25, 26, (n, 3)), 0, 255)
    return Backdrop(width, indoor, low, np.column_stack([xs, ys, ws, hs, cols]))


def paint(drawn: Backdrop) -> np.ndarray:
    ppd = drawn.width / HFOV
    pw, ph = round(360 * ppd), round(VSPAN * ppd)
    pano = cv2.resize(drawn.low, (pw, ph), interpolation=cv2.INTER_CUBIC)
    top, bottom = ((190, 200, 215), (100, 110, 115)) if drawn.indoor else ((230, 190, 150), (110, 110, 110))
    ramp = np.linspace(0.0, 1.0, ph, dtype=np.float32)[:, None, None]
    base = (1 - ramp) * np.float32(top) + ramp * np.float32(bottom)
    pano = (0.25 * pano + 0.75 * base).astype(np.uint8)
    # Many small sharp-edged patches: corners everywhere so ORB finds features at any view.
    for x, y, w, h, *c in drawn.patches.tolist():
        cv2.rectangle(pano, (x, y), (x + w, y + h), c, -1)
    return pano


def panorama(rng: np.random.Generator, width: int, indoor: bool) -> np.ndarray:
    return paint(backdrop(rng, width, indoor))


def draw_thing(pano: np.ndarray, thing: Thing, ppd: float) -> None:
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
    """Whether the object's centre is inside the frame, less a margin."""
    x = 0.5 + wrap180(thing.azimuth - pose.yaw) * pose.zoom / HFOV
    y = 0.5 - (thing.elevation - pose.pitch) * pose.zoom / (HFOV * aspect)
    return margin <= x <= 1 - margin and margin <= y <= 1 - margin


def glimpsed(thing: Thing, pose: Pose, aspect: float = 0.5625) -> bool:
    ex, ey = EXTENT[thing.shape]
    dx = abs(wrap180(thing.azimuth - pose.yaw)) - ex * thing.size
    dy = abs(thing.elevation - pose.pitch) - ey * thing.size
    return dx * pose.zoom < HFOV / 2 and dy * pose.zoom < HFOV * aspect / 2


def camera_view(pano: np.ndarray, pose: Pose, width: int, height: int) -> np.ndarray:
    """``pose`` already kept ``inside`` the panorama."""
    ppd = width / HFOV
    z, cx, cy = pose.zoom, pose.yaw * ppd, pano.shape[0] / 2 - pose.pitch * ppd
    m = np.float32([[z, 0, width / 2 - z * cx], [0, z, height / 2 - z * cy]])
    return cv2.warpAffine(pano, m, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_WRAP)


def visibility(things: Sequence[Thing], pose_fn: Callable[[float], Pose], n: int, fps: float,
               aspect: float) -> tuple[list[int | None], list[int | None]]:
    """Per object, the first frame its centre is in view and the first any part of it is: from
    the camera's path alone."""
    first_seen: list[int | None] = [None] * len(things)
    first_glimpse: list[int | None] = [None] * len(things)
    for f in range(n):
        pose = inside(pose_fn(f / fps), aspect)
        for i, thing in enumerate(things):
            if first_seen[i] is None and in_view(thing, pose, aspect):
                first_seen[i] = f
            if first_glimpse[i] is None and glimpsed(thing, pose, aspect):
                first_glimpse[i] = f
    return first_seen, first_glimpse


def write_frames(pano: np.ndarray, pose_fn: Callable[[float], Pose], outputs: Sequence[tuple[Path, int]],
                 fps: float, width: int, height: int) -> None:
    """Render ``max(n)`` frames, the first ``n`` to each output (prefix clips), then read each back."""
    writers = []
    for path, n in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
        if not w.isOpened():
            _no_room(path)
            raise RuntimeError(f"OpenCV cannot write {path}: its FFmpeg build lacks the mp4v encoder")
        writers.append((w, n))
    try:
        for f in range(max(n for _, n in outputs)):
            frame = camera_view(pano, inside(pose_fn(f / fps), height / width), width, height)
            for w, n in writers:
                if f < n:
                    w.write(frame)
    finally:
        for w, _ in writers:
            w.release()
    for path, n in outputs:
        _check_written(path, n)


def render(pano: np.ndarray, things: Sequence[Thing], pose_fn: Callable[[float], Pose],
           outputs: Sequence[tuple[Path, int]], fps: float, width: int, height: int
           ) -> tuple[list[int | None], list[int | None]]:
    write_frames(pano, pose_fn, outputs, fps, width, height)
    return visibility(things, pose_fn, max(n for _, n in outputs), fps, height / width)


# Below this much free space a writer that failed is taken to have met a full disk.
_ROOM_BYTES = 1 << 20


def _no_room(path: Path) -> None:
    # OpenCV's writer says only that it failed; a full disk must be named as one.
    import errno
    import shutil

    if shutil.disk_usage(path.parent).free < _ROOM_BYTES:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))


def _check_written(path: Path, n: int) -> None:
    # OpenCV's writer drops the frames it cannot write with only a warning: a disk that filled
    # would otherwise leave cut videos taken as finished.
    from embodied_r.keyframes.ffmpeg import ffmpeg_messages

    with ffmpeg_messages() as said:
        cap = cv2.VideoCapture(str(path))
    try:
        count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) if cap.isOpened() else 0
    finally:
        cap.release()
    if count != n:
        _no_room(path)
        raise RuntimeError(f"OpenCV wrote {path} with {count} of its {n} frames"
                           + (f" (FFmpeg: {'; '.join(said)})" if said else ""))


def write_motion_video(path: Path, motions: Sequence[tuple[str, float, float]], *, seed: int = 0,
                       width: int = 320, height: int = 180, fps: float = 30.0) -> Path:
    """Write a clip of a random textured world following ``(action, seconds, rate)`` motions."""
    rng = np.random.default_rng(seed)
    segs = segments_from(motions)
    total = sum(s.duration for s in segs)
    pano = panorama(rng, width, indoor=False)
    render(pano, [], lambda t: pose_at(segs, t), [(Path(path), max(1, round(total * fps)))],
           fps, width, height)
    return Path(path)


def options(rng: np.random.Generator, correct: str, others: Sequence[str], order: str,
            closed: Sequence[str] | None = None) -> tuple[list[str], str]:
    """Options and the answer letter; ``closed``: the task's closed set of answers, listed as it
    is under ``option_order: fixed`` (without one, the options are shuffled there)."""
    if order == "fixed" and closed is not None:
        if correct not in closed:
            raise ValueError(f"answer {correct!r} is not in its task's closed set {list(closed)}")
        return list(closed), LETTERS[list(closed).index(correct)]
    opts = [correct, *others]
    # Drawn even when sorted, so every order gives the same questions.
    drawn = [opts[i] for i in rng.permutation(len(opts)).tolist()]
    listed = sorted(opts) if order == "sorted" else drawn
    return listed, LETTERS[listed.index(correct)]


class Balancer:
    """How often each answer of each task has been right so far, across a whole benchmark."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def pick(self, task: str, candidates: Sequence[tuple[str, object]], rng: np.random.Generator,
             universe: Sequence[str] = (), slack: int | None = None) -> object | None:
        """The item of ``candidates`` ((answer, item) pairs) whose answer was right least often,
        ties broken by ``rng``; ``universe``: every answer the task has. With ``slack``, None
        rather than an answer already right ``slack`` times more than the least used one."""
        counts = self.counts.setdefault(task, dict.fromkeys(universe, 0))
        order = rng.permutation(len(candidates)).tolist()
        answer, item = min((candidates[i] for i in order), key=lambda c: counts.get(c[0], 0))
        if slack is not None and counts.get(answer, 0) >= min(counts.values(), default=0) + slack:
            return None
        counts[answer] = counts.get(answer, 0) + 1
        return item
