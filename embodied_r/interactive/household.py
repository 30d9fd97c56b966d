"""The built-in house on the CPU, a stand-in for AI2-THOR: a scene derived from each task, and drawn views."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

from embodied_r.interactive.environment import StepResult
from embodied_r.interactive.legality import Legality, Seen

OPENABLE = {"Fridge", "Cabinet", "Drawer", "Microwave", "Box", "Safe", "Laptop"}
TOGGLEABLE = {"Faucet", "StoveBurner", "Microwave", "DeskLamp", "FloorLamp", "Television", "CoffeeMachine",
              "Toaster", "LightSwitch", "Laptop"}
SURFACES = ("CounterTop", "DiningTable", "Shelf", "Desk", "SideTable", "Sofa", "Bed", "Dresser")
SMALL = ("Mug", "Book", "Spoon", "Apple", "Pen", "Bowl", "Cup", "Tomato", "KeyChain", "Vase")
BIG = ("Cabinet", "GarbageCan", "Chair", "Fridge", "Shelf", "Drawer", "SideTable")
# What the legality rule sees: boxes and distances chosen so that a small thing is navigable
# only beside the agent (under 1 m) and a large one from anywhere in the room.
SMALL_BOX = (0.1, 0.1, 0.1)
LARGE_BOX = (1.0, 1.0, 1.0)
BESIDE_M, ACROSS_M = 0.5, 3.0


@dataclass
class Thing:
    type: str
    parent: str | None = None  # what it is in or on
    near: str | None = None  # a fixture reachable from that thing
    pickupable: bool = False
    openable: bool = False
    is_open: bool = False
    toggleable: bool = False
    is_on: bool = False
    receptacle: bool = False  # a pickupable thing that takes others (a pan, a bowl)


def _pick(seed: str, options: tuple[str, ...], n: int) -> list[str]:
    ranked = sorted(options, key=lambda o: hashlib.sha256(f"{seed}/{o}".encode()).hexdigest())
    return ranked[:n]


def scene_from_task(task: dict[str, Any]) -> dict[str, Thing]:
    """Things of a task's scene such that its key actions, replayed, succeed, plus a few distractors
    drawn by the scene's name: any case in the benchmark's schema runs here."""
    things: dict[str, Thing] = {}

    def ensure(kind: str) -> Thing:
        if kind not in things:
            things[kind] = Thing(kind, openable=kind in OPENABLE, toggleable=kind in TOGGLEABLE)
        return things[kind]

    for kind in task.get("navigable_objects") or []:
        ensure(kind)
    here: str | None = None
    opened: set[str] = set()
    visited: set[str] = set()
    for act in task["task_metadata"]["actions"]:
        verb, kind = act["action"], act.get("objectType") or ""
        if not kind:
            continue
        thing = ensure(kind)
        if verb == "navigate to":
            here = kind
            visited.add(kind)
        elif verb.startswith("put"):
            thing.receptacle = True
            if thing.parent is None and kind not in visited and here and here != kind:
                thing.parent = here  # a pot on the counter, a plate in the open cabinet
        elif verb == "pickup":
            thing.pickupable = True
            if thing.parent is None and here and here != kind:
                thing.parent = here
        elif verb in ("open", "close", "toggle"):
            thing.openable |= verb != "toggle"
            if verb == "open":
                opened.add(kind)
            thing.toggleable |= verb == "toggle"
            if here and here != kind and things[here].parent != kind and thing.near is None:
                thing.near = here
    # What a search looks for sits in or on the thing the search navigates to.
    targets = [t.split("|")[0] for t in task.get("target_objects") or []]
    for related in task.get("related_objects") or []:
        kind = related.split("|")[0]
        if kind not in things:
            ensure(kind).pickupable = True
            things[kind].parent = next((t for t in targets if t in things and t != kind), None)
    seed = f"{task.get('scene', '')}/{task.get('identity', '')}"
    for kind in _pick(seed, BIG, 2):
        ensure(kind)
    surfaces = [k for k, t in things.items() if t.parent is None and not t.pickupable and not t.openable]
    for kind in _pick(seed + "/small", SMALL, 2):
        if kind not in things and surfaces:
            ensure(kind).pickupable = True
            things[kind].parent = _pick(seed + kind, tuple(surfaces), 1)[0]
    for thing in things.values():
        # What the task opens starts closed; every other openable thing starts open, so a
        # task that puts into a box it never opens stays solvable.
        thing.is_open = thing.type not in opened
    return things


def _colour(name: str) -> tuple[int, int, int]:
    digest = hashlib.sha256(name.encode()).digest()
    return 60 + digest[0] % 180, 60 + digest[1] % 180, 60 + digest[2] % 180


class HouseholdEnvironment:
    """The agent stands at one thing and acts on it, on what is in or on it, and on fixtures beside it."""

    def __init__(self, width: int = 192, height: int = 108):
        self.size = (width, height)
        self.things: dict[str, Thing] = {}
        self.at: str | None = None
        self.holding: str | None = None
        self.out = Path(".")
        self.steps = 0
        self.legality = Legality()

    def _accessible(self, thing: Thing) -> bool:
        if thing.type == self.holding:
            return False
        parent = self.things.get(thing.parent) if thing.parent else None
        while parent is not None:
            if parent.openable and not parent.is_open:
                return False
            parent = self.things.get(parent.parent) if parent.parent else None
        return True

    def _reachable(self, kind: str) -> bool:
        thing = self.things[kind]
        if not self._accessible(thing) or self.at is None:
            return False
        if kind == self.at or thing.near == self.at or self.things[self.at].parent == kind:
            return True
        parent = thing.parent
        while parent is not None:  # in or on the thing here, at any depth
            if parent == self.at:
                return True
            parent = self.things[parent].parent if parent in self.things else None
        return False

    def in_sight(self) -> list[str]:
        return [k for k, t in self.things.items()
                if self._accessible(t) and (t.parent is None or self._reachable(k))]

    def seen(self) -> list[Seen]:
        return [Seen(k, k, self._accessible(t), SMALL_BOX if t.pickupable else LARGE_BOX,
                     BESIDE_M if self.at is not None and self._reachable(k) else ACROSS_M)
                for k, t in self.things.items()]

    def legal_objects(self) -> list[str]:
        return self.legality.legal_objects

    def object_types(self) -> list[str]:
        return list(self.things)

    def _render(self, view: str = "") -> Image.Image:
        w, h = self.size
        wall = _colour(f"wall/{self.at}/{view}")
        img = Image.new("RGB", (w, h), wall)
        draw = ImageDraw.Draw(img)
        draw.rectangle([0, int(h * 0.62), w, h], fill=tuple(c // 2 for c in wall))
        shown = self.in_sight()
        if view:
            # Another heading shows the free-standing things in another order.
            shift = {"left": 1, "back": 2, "right": 3}.get(view, 0)
            shown = shown[shift % max(len(shown), 1):] + shown[:shift % max(len(shown), 1)]
        slot = w / max(len(shown), 1)
        for i, kind in enumerate(shown):
            thing = self.things[kind]
            small = thing.pickupable
            x0, y1 = int(i * slot + 2), int(h * (0.6 if small else 0.9))
            y0 = int(y1 - h * (0.18 if small else 0.5))
            draw.rectangle([x0, y0, max(x0 + 1, int(x0 + slot - 4)), y1], fill=_colour(kind),
                           outline=(255, 255, 255) if kind == self.at else (0, 0, 0))
            state = " open" if thing.openable and thing.is_open else " on" if thing.toggleable and thing.is_on else ""
            draw.text((x0 + 1, y0 + 1), kind[:10] + state, fill=(0, 0, 0))
        if self.holding:
            draw.rectangle([w - 60, h - 16, w - 2, h - 2], fill=_colour(self.holding))
            draw.text((w - 58, h - 15), self.holding[:9], fill=(0, 0, 0))
        if view:
            draw.text((2, h - 12), view, fill=(255, 255, 255))
        return img

    def _save(self, img: Image.Image, name: str) -> str:
        path = self.out / f"{self.steps:03d}_{name.replace(' ', '_')}.png"
        img.save(path)
        return str(path.resolve())

    def _view(self, name: str) -> StepResult:
        self.legality.observe(self.seen())
        return StepResult(True, [self._save(self._render(), name)], self.legal_objects())

    def reset(self, task: dict[str, Any], out_dir: Path) -> StepResult:
        self.things = scene_from_task(task)
        self.at, self.holding, self.steps = None, None, 0
        self.legality = Legality.for_task(task)
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        return self._view("init")

    def _fail(self, action: str, obj: str | None, reason: str, acted: bool = True) -> StepResult:
        # An action tried (not refused as illegal) updates the lists.
        if acted:
            self.legality.observe(self.seen())
        text = f"{action} {obj}" if obj else action
        return StepResult(False, [], self.legal_objects(), f'"{text}" cannot be done: {reason}.')

    def step(self, action: str, obj: str | None = None) -> StepResult:
        self.steps += 1
        if action == "observe":
            views = [self._render(v) for v in ("left", "back", "right")]
            w, h = self.size
            merged = Image.new("RGB", (3 * w + 10, h), (0, 0, 0))
            for i, view in enumerate(views):
                merged.paste(view, (i * (w + 5), 0))
            self.legality.observe(self.seen())
            return StepResult(True, [self._save(merged, "observe")], self.legal_objects())
        if action in ("init", "move forward"):
            return self._view(action)
        if action in ("put", "put in") and obj is None:
            obj = self.at  # a bare "put" puts the held object where the agent stands
        if obj is None or obj not in self.things:
            return self._fail(action, obj, "no such object in this room", acted=False)
        thing = self.things[obj]
        if not self.legality.allows(action, obj):
            why = "it is not navigable from here" if action == "navigate to" else "it is not available for interaction here"
            return self._fail(action, obj, why, acted=False)
        if action == "navigate to":
            if not self._accessible(thing):
                return self._fail(action, obj, "it is not in sight")
            self.at = obj  # a teleport, as the original's navigation is
            inside = [k for k, t in self.things.items() if t.parent == obj]
            if inside or thing.openable or obj in SURFACES:
                self.legality.enter(inside)  # a receptacle: what is in it may be acted on once visible
            return self._view(f"navigate_{obj}")
        if not self._reachable(obj):
            return self._fail(action, obj, "it is out of reach from here")
        if action == "pickup":
            if not thing.pickupable:
                return self._fail(action, obj, "it cannot be picked up")
            if self.holding:
                return self._fail(action, obj, f"the hand already holds {self.holding}")
            self.holding, thing.parent = obj, None
        elif action in ("put", "put in"):
            if not self.holding:
                return self._fail(action, obj, "the hand is empty")
            if (thing.pickupable and not thing.receptacle) or (thing.openable and not thing.is_open):
                return self._fail(action, obj, "it cannot take anything now")
            self.things[self.holding].parent, self.holding = obj, None
        elif action in ("open", "close"):
            if not thing.openable or thing.is_open == (action == "open"):
                return self._fail(action, obj, f"it cannot be {'opened' if action == 'open' else 'closed'}")
            thing.is_open = action == "open"
        elif action == "toggle":
            if not thing.toggleable:
                return self._fail(action, obj, "it has no switch")
            thing.is_on = not thing.is_on
        else:
            return self._fail(action, obj, "unknown action")
        return self._view(f"{action}_{obj}")

    def close(self) -> None:
        self.things = {}
