"""Where the original evaluator places the agent in AI2-THOR: start, navigation and look-at; pure geometry."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from embodied_r.errors import PosesError

POSES_RELPATH = Path("data") / "agent_positions.json"
_CORNERS = ((2, 225), (3, 315), (6, 135), (7, 45))  # corner point index, heading into the room
REACH = 1.5  # metres from the object a candidate may stand
LINE_GAP = 0.1  # candidates this much farther from the facing line than the best still count
NAV_HORIZON = 60  # camera tilt after a computed navigation (degrees down)
CROUCH_ABOVE = 0.44  # crouch when the agent stands this much above the object's lowest corner


def load_poses(checkout: str | Path | None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{scene: {objectId: pose}}`` from the user's checkout of the original repository; keyed by
    scene (the original merges all scenes), an object id in two scenes keeps its own pose."""
    if not checkout:
        raise PosesError("AI2-THOR navigation needs the original's hand-made poses: set evaluate.original_checkout "
                         f"to a checkout of zwq2018/embodied_reasoner (it reads {POSES_RELPATH})")
    path = Path(checkout).expanduser() / POSES_RELPATH
    if not path.is_file():
        raise PosesError(f"{path} not found: point evaluate.original_checkout at a checkout of "
                         "zwq2018/embodied_reasoner")
    try:
        data = json.loads(path.read_text())
        poses: dict[str, dict[str, dict[str, Any]]] = {}
        for entry in data.values():
            scene = entry["scene"]
            for key, pose in entry.items():
                if isinstance(pose, dict):
                    pose["agent_teleport_position"], pose["agent_rotation"], pose["agent_cameraHorizon"]
                    poses.setdefault(scene, {})[key] = pose
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PosesError(f"{path}: not the original's poses file ({type(exc).__name__}: {exc})") from exc
    return poses


def _flat(a: dict[str, float], b: dict[str, float]) -> float:
    return math.hypot(a["x"] - b["x"], a["z"] - b["z"])


def start_pose(corner_points: list[list[float]], reachable: list[dict[str, float]],
               tried: list[dict[str, float]] = ()) -> tuple[dict[str, float], int] | None:
    """The reachable position nearest a floor corner and the diagonal heading from it."""
    best, best_d = None, math.inf
    for index, heading in _CORNERS:
        corner = corner_points[index]
        for p in reachable:
            if p in tried:
                continue
            d = math.hypot(p["x"] - corner[0], p["z"] - corner[2])
            if d < best_d:
                best, best_d = (p, heading), d
    return best


def _size(obj: dict[str, Any]) -> tuple[float, float]:
    s = obj["axisAlignedBoundingBox"]["size"]
    x, y, z = s["x"], s["y"], s["z"]
    return round(x * y * z, 4), round(max(x * y, x * z, y * z), 4)


def _nearest(obj: dict[str, Any], poses: list[dict[str, Any]]) -> tuple[dict[str, Any], int] | None:
    if not poses:
        return None
    p = min(poses, key=lambda q: _flat(q, obj["position"]))
    return p, int(p.get("rotation", 0))


def _pick_on_line(obj: dict[str, Any], heading: int, cands: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Among candidates near the line the object faces along, one by the object's size."""
    if not cands:
        return None
    c, h = obj["position"], math.radians(heading)
    off = [abs((p["x"] - c["x"]) * math.cos(h) - (p["z"] - c["z"]) * math.sin(h)) for p in cands]
    best = min(off)
    line = sorted((p for p, o in zip(cands, off) if o <= best + LINE_GAP), key=lambda p: _flat(p, c))
    volume, face = _size(obj)
    if volume <= 0.2 and face <= 0.5:
        return line[0]
    within = [p for p in line if _flat(p, c) <= 1.0]
    if not within:
        return None
    if volume <= 1 and face <= 1:
        return within[len(within) // 2]
    return within[-1]


def _side(obj: dict[str, Any], p: dict[str, Any], direction: int) -> bool:
    """Whether ``p`` is ahead of the object along an axis heading, or inside a diagonal's quadrant."""
    dx, dz = p["x"] - obj["position"]["x"], p["z"] - obj["position"]["z"]
    ux, uz = math.sin(math.radians(direction)), math.cos(math.radians(direction))
    if direction % 90:
        return dx * ux > 0 and dz * uz > 0
    return dx * ux + dz * uz > 1e-9


def _in_line(obj: dict[str, Any], cands: list[dict[str, Any]], heading: int) -> list[dict[str, Any]]:
    """Axis headings: candidates within the first of 0.1 ... 0.5 m of the facing axis that has any."""
    lateral = "x" if heading in (0, 180) else "z"
    for tol in (0.1, 0.2, 0.3, 0.4, 0.5):
        found = [p for p in cands if abs(p[lateral] - obj["position"][lateral]) <= tol]
        if found:
            return found
    return []


def navigation_pose(obj: dict[str, Any], interactable: list[dict[str, Any]],
                    tried: list[dict[str, Any]] = ()) -> tuple[dict[str, Any], int] | None:
    """``(pose, heading)`` or None when none is left: the interactable poses within ``REACH`` on the
    side the object faces, then behind it, then (diagonals) beside it, one picked by the object's
    size (``_pick_on_line``); small objects, or no candidate, take the nearest."""
    # One rule for every heading: the original's per-heading branches differ in ways that read as slips.
    near = [p for p in interactable if _flat(p, obj["position"]) <= REACH and p not in tried]
    if not near:
        return None
    volume, face = _size(obj)
    if volume <= 0.1 and face <= 1:
        return _nearest(obj, near)
    heading = min(range(0, 361, 45), key=lambda a: abs(a - round(obj["rotation"]["y"]))) % 360
    cands = _in_line(obj, near, heading) if heading % 90 == 0 else near
    sides = [(heading, (heading + 180) % 360), ((heading + 180) % 360, heading)]
    if heading % 90:
        sides += [((heading + 90) % 360, (heading + 270) % 360), ((heading + 270) % 360, (heading + 90) % 360)]
    for side, facing in sides:
        chosen = _pick_on_line(obj, heading, [p for p in cands if _side(obj, p, side)])
        if chosen is not None:
            return chosen, facing
    return _nearest(obj, near)


def look_at(camera: dict[str, float], centre: dict[str, float], horizon: float, yaw: float) -> tuple[float, float]:
    """``(look up by, rotate left by)`` in degrees toward ``centre``, the tilt within 30 up and 60 down."""
    dx, dy, dz = centre["x"] - camera["x"], centre["y"] - camera["y"], centre["z"] - camera["z"]
    norm = math.sqrt(dx * dx + dy * dy + dz * dz) or 1.0
    pitch = math.degrees(math.asin(max(-1.0, min(1.0, dy / norm))))
    target = min(30, int(pitch)) if int(pitch) > 0 else max(-60, int(pitch))
    heading = math.degrees(math.atan2(dx, dz)) % 360
    nearest = min(range(0, 361, 45), key=lambda a: abs(a - round(heading))) % 360
    # The camera's horizon counts degrees down; the tilt above counts up.
    return target - (-horizon), yaw - nearest


def crouch(agent_y: float, lowest_corner_y: float) -> bool:
    return agent_y > lowest_corner_y + CROUCH_ABOVE
