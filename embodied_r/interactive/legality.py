"""Which actions the agent may take, by the original evaluator's rules; pure, shared by both environments."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

INTERACTIONS = ("pickup", "put", "put in", "open", "close", "toggle")
# Free actions: no object, always legal (the episode loop decides "end").
FREE = ("init", "observe", "move forward", "end")

# (largest face in m², or volume in m³ where marked, and the distance below which it counts),
# tried in order: the original's tiers for objects too small or too far for their volume.
_FACE_TIERS = ((0.5, 10.0), (0.15, 4.0), (0.08, 2.5))
_VOLUME_TIERS = ((0.005, 2.0), (0.001, 1.5))
_NEAR = 1.0  # anything visible this close is navigable
_SMALL_VOLUME = 0.01  # below: judged by the tiers alone
_MIN_RATE = 0.02  # volume / distance at or below which a big object is too far


@dataclass(frozen=True)
class Seen:
    object_id: str
    type: str
    visible: bool
    size: tuple[float, float, float]  # the axis-aligned box's x, y, z extent in metres
    distance: float  # floor-plane metres, agent to the box's centre


def seen_in(metadata: dict[str, Any]) -> list[Seen]:
    agent = metadata["agent"]["position"]
    out = []
    for obj in metadata["objects"]:
        if obj["objectType"] == "Floor":
            continue
        box = obj["axisAlignedBoundingBox"]
        size, centre = box["size"], box["center"]
        out.append(Seen(obj["objectId"], obj["objectType"], bool(obj.get("visible")),
                        (size["x"], size["y"], size["z"]),
                        math.hypot(centre["x"] - agent["x"], centre["z"] - agent["z"])))
    return out


def _close_enough(face: float, volume: float, d: float) -> bool:
    return (any(face > f and d < dist for f, dist in _FACE_TIERS)
            or any(volume > v and d < dist for v, dist in _VOLUME_TIERS) or d < _NEAR)


def is_navigable(seen: Seen) -> bool:
    """The original's size-and-distance rule for one visible object."""
    if not seen.visible:
        return False
    x, y, z = seen.size
    volume, face, d = x * y * z, max(x * z, x * y, y * z), seen.distance
    if volume < _SMALL_VOLUME:
        return _close_enough(face, volume, d)
    # The original divides by a zero distance; an agent inside a box's centre is beside it.
    rate = volume / d if d > 0 else math.inf
    return rate > _MIN_RATE or _close_enough(face, volume, d)


def navigable_now(seen: Iterable[Seen]) -> list[str]:
    """Types navigable from here, ordered as the original orders them."""
    ranked = sorted((s for s in seen if is_navigable(s)),
                    key=lambda s: s.size[0] * s.size[1] * s.size[2] / s.distance if s.distance > 0 else 0.0)
    return list(dict.fromkeys(s.type for s in ranked))


def interactions_now(seen: Iterable[Seen], container: Iterable[str],
                     near: Iterable[str] | None = None) -> list[str]:
    """Types navigable from here (``near``, when already worked out) or visible in the container."""
    inside = set(container)
    seen = list(seen)
    near = set(navigable_now(seen) if near is None else near)
    return list(dict.fromkeys(s.type for s in seen if s.type in near or (s.visible and s.type in inside)))


@dataclass
class Legality:
    """The two lists of one episode; ``observe`` after every action that updates them."""

    navigable: list[str] = field(default_factory=list)
    interactions: list[str] = field(default_factory=list)
    container: list[str] = field(default_factory=list)  # types in the container last navigated to

    @classmethod
    def for_task(cls, task: dict[str, Any]) -> "Legality":
        return cls(navigable=list(dict.fromkeys(task.get("navigable_objects") or [])))

    def observe(self, seen: Iterable[Seen], navigable: bool = True, interactions: bool = True) -> None:
        """Add what is navigable now and recompute the legal interactions (the original's ``observe``
        grows the navigable list at each of its views, the interactions at the heading it returns to)."""
        seen = list(seen)
        near = navigable_now(seen) if navigable or interactions else []
        if navigable:
            for kind in near:
                if kind not in self.navigable:
                    self.navigable.append(kind)
        if interactions:
            self.interactions = interactions_now(seen, self.container, near)

    def enter(self, contents: Iterable[str]) -> None:
        """The agent navigated to a receptacle holding these types."""
        self.container = list(contents)

    def allows(self, verb: str, kind: str | None) -> bool:
        if verb in FREE:
            return True
        if kind is None:
            return False
        if verb == "navigate to":
            return kind in self.navigable
        return verb in INTERACTIONS and kind in self.interactions

    @property
    def legal_objects(self) -> list[str]:
        """The input of the single-search ``end`` rule: the legal interactions."""
        return list(self.interactions)
