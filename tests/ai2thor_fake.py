"""A fake AI2-THOR controller: events in ai2thor 5.0.0's metadata shape, a little physics.

Only the metadata fields the original evaluator reads are made: objects (objectId,
objectType, name, position, rotation, axisAlignedBoundingBox center/size/cornerPoints,
visible, distance, isOpen, openable, pickupable, isPickedUp, receptacle,
receptacleObjectIds, parentReceptacles, toggleable, isToggled), agent (position, rotation,
cameraHorizon, isStanding), cameraPosition, sceneBounds.cornerPoints, inventoryObjects,
lastActionSuccess, errorMessage and actionReturn (GetReachablePositions,
GetInteractablePoses). Visibility: within 20 m, inside a 90-degree field of view, not in a
closed container, not held. Interactions need the object within 1.5 m.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

GRID = 0.25
ROOM = 2.0  # the room spans -ROOM..ROOM in x and z
AGENT_Y = 0.9
EYE = {True: 0.675, False: 0.2}  # camera above the agent's position, standing / crouched


def _obj(oid: str, pos: tuple[float, float, float], size: tuple[float, float, float], yaw: float = 0.0,
         parent: str | None = None, **flags: Any) -> dict[str, Any]:
    kind = oid.split("|")[0]
    (x, y, z), (sx, sy, sz) = pos, size
    corners = [[x + dx * sx / 2, y + dy * sy / 2, z + dz * sz / 2]
               for dx in (1, -1) for dy in (1, -1) for dz in (1, -1)]
    corners.sort(key=lambda c: c[1])  # the lowest corner first, as AI2-THOR lists them
    return {"objectId": oid, "objectType": kind, "name": f"{kind}_{abs(hash(oid)) % 10**8:08x}",
            "position": dict(x=x, y=y, z=z), "rotation": dict(x=0.0, y=yaw, z=0.0),
            "axisAlignedBoundingBox": {"center": dict(x=x, y=y, z=z), "size": dict(x=sx, y=sy, z=sz),
                                       "cornerPoints": corners},
            "visible": False, "distance": 0.0, "isOpen": False, "openable": False, "pickupable": False,
            "isPickedUp": False, "receptacle": False, "receptacleObjectIds": [],
            "parentReceptacles": [parent] if parent else None, "toggleable": False, "isToggled": False,
            **flags}


def kitchen() -> list[dict[str, Any]]:
    return [
        _obj("Floor|+00.00|+00.00|+00.00", (0, 0, 0), (4, 0.01, 4), receptacle=True),
        _obj("CounterTop|+01.50|+00.45|+00.00", (1.5, 0.45, 0.0), (0.6, 0.9, 2.0), yaw=270, receptacle=True,
             receptacleObjectIds=["Apple|+01.50|+00.95|+00.50"]),
        _obj("Apple|+01.50|+00.95|+00.50", (1.5, 0.95, 0.5), (0.08, 0.08, 0.08),
             parent="CounterTop|+01.50|+00.45|+00.00", pickupable=True),
        _obj("Fridge|-01.50|+00.90|+01.50", (-1.5, 0.9, 1.5), (0.7, 1.8, 0.7), yaw=90, openable=True,
             receptacle=True, receptacleObjectIds=["Egg|-01.50|+01.00|+01.50"]),
        _obj("Egg|-01.50|+01.00|+01.50", (-1.5, 1.0, 1.5), (0.05, 0.06, 0.05),
             parent="Fridge|-01.50|+00.90|+01.50", pickupable=True),
        _obj("GarbageCan|-01.50|+00.20|-01.50", (-1.5, 0.2, -1.5), (0.3, 0.4, 0.3), receptacle=True),
        _obj("Toaster|+00.00|+00.10|+01.80", (0.0, 0.1, 1.8), (0.3, 0.2, 0.2), toggleable=True),
    ]


def bedroom() -> list[dict[str, Any]]:
    return [
        _obj("Floor|+00.00|+00.00|+00.00", (0, 0, 0), (4, 0.01, 4), receptacle=True),
        _obj("Bed|+01.40|+00.30|+00.00", (1.4, 0.3, 0.0), (1.0, 0.6, 2.0), yaw=270, receptacle=True,
             receptacleObjectIds=["Pillow|+01.40|+00.65|+00.60"]),
        _obj("Pillow|+01.40|+00.65|+00.60", (1.4, 0.65, 0.6), (0.5, 0.1, 0.3),
             parent="Bed|+01.40|+00.30|+00.00", pickupable=True),
        _obj("Desk|-01.50|+00.40|+00.00", (-1.5, 0.4, 0.0), (0.6, 0.8, 1.2), yaw=90, receptacle=True),
    ]


SCENES = {"FloorPlan1": kitchen, "FloorPlan301": bedroom}


@dataclass
class Event:
    metadata: dict[str, Any]
    frame: np.ndarray


class FakeController:
    def __init__(self, scene: str = "FloorPlan1", width: int = 80, height: int = 45):
        self.size = (height, width)
        self.calls: list[dict[str, Any]] = []
        self.blocked_teleports: list[tuple[float, float]] = []  # positions a Teleport refuses
        self.walls: set[tuple[float, float]] = set()  # reachable cells MoveAhead may not enter
        self.stopped = False
        self.reset(scene)

    # -- state ----------------------------------------------------------------------------

    def reset(self, scene: str = "FloorPlan1", **_: Any) -> Event:
        self.scene = scene
        self.objects = SCENES[scene]()
        self.agent = {"position": dict(x=0.0, y=AGENT_Y, z=0.0), "rotation": dict(x=0.0, y=0.0, z=0.0),
                      "cameraHorizon": 30.0, "isStanding": True}
        self.held: str | None = None
        self.calls.append({"action": "reset", "scene": scene})
        return self._event("")

    def reachable(self) -> list[dict[str, float]]:
        out = []
        steps = int(2 * (ROOM - GRID) / GRID) + 1
        for i in range(steps):
            for j in range(steps):
                x, z = round(-ROOM + GRID + i * GRID, 2), round(-ROOM + GRID + j * GRID, 2)
                if not any(self._inside(o, x, z) for o in self.objects if o["objectType"] != "Floor"
                           and not o["pickupable"]):
                    out.append(dict(x=x, y=AGENT_Y, z=z))
        return out

    @staticmethod
    def _inside(o: dict[str, Any], x: float, z: float, margin: float = 0.1) -> bool:
        c, s = o["position"], o["axisAlignedBoundingBox"]["size"]
        return abs(x - c["x"]) < s["x"] / 2 + margin and abs(z - c["z"]) < s["z"] / 2 + margin

    def _by_id(self, oid: str) -> dict[str, Any] | None:
        return next((o for o in self.objects if o["objectId"] == oid), None)

    def _flat(self, o: dict[str, Any]) -> float:
        a = self.agent["position"]
        return math.hypot(o["position"]["x"] - a["x"], o["position"]["z"] - a["z"])

    def _hidden(self, o: dict[str, Any]) -> bool:
        if o["isPickedUp"]:
            return True
        for pid in o["parentReceptacles"] or []:
            parent = self._by_id(pid)
            if parent and parent["openable"] and not parent["isOpen"]:
                return True
        return False

    def _visible(self, o: dict[str, Any]) -> bool:
        if self._hidden(o) or self._flat(o) > 20:
            return False
        if self._flat(o) < 0.3:
            return True
        a = self.agent["position"]
        bearing = math.degrees(math.atan2(o["position"]["x"] - a["x"], o["position"]["z"] - a["z"])) % 360
        off = abs((bearing - self.agent["rotation"]["y"] + 180) % 360 - 180)
        return off <= 45

    def _event(self, error: str, returned: Any = None) -> Event:
        a = self.agent
        camera = dict(x=a["position"]["x"], y=a["position"]["y"] + EYE[a["isStanding"]], z=a["position"]["z"])
        for o in self.objects:
            o["visible"] = self._visible(o)
            c = o["position"]
            o["distance"] = math.dist((c["x"], c["y"], c["z"]), (camera["x"], camera["y"], camera["z"]))
        corners = [[x, y, z] for x in (ROOM, -ROOM) for y in (2.5, 0.0) for z in (ROOM, -ROOM)]
        meta = {"objects": copy.deepcopy(self.objects), "agent": copy.deepcopy(a), "cameraPosition": camera,
                "sceneName": self.scene, "sceneBounds": {"cornerPoints": corners},
                "inventoryObjects": [{"objectId": self.held}] if self.held else [],
                "lastActionSuccess": not error, "errorMessage": error, "actionReturn": returned}
        # A frame that differs by scene, place and heading, so views are not all alike.
        shade = (hash((self.scene, a["position"]["x"], a["position"]["z"], a["rotation"]["y"])) % 200) + 30
        frame = np.full((*self.size, 3), shade, dtype=np.uint8)
        self.last_event = Event(meta, frame)
        return self.last_event

    # -- actions ---------------------------------------------------------------------------

    def step(self, action: Any = None, **kw: Any) -> Event:
        if isinstance(action, dict):
            kw, action = {k: v for k, v in action.items() if k != "action"}, action["action"]
        self.calls.append({"action": action, **kw})
        handler = getattr(self, f"_do_{action}", None)
        if handler is None:
            return self._event(f"unknown action {action}")
        return handler(**kw)

    def _do_GetReachablePositions(self) -> Event:
        return self._event("", self.reachable())

    def _do_GetInteractablePoses(self, objectId: str) -> Event:
        """Poses within 2 m, each facing the object (the nearest of four headings), as
        AI2-THOR returns only poses from which the object can be acted on."""
        o = self._by_id(objectId)
        poses = []
        for p in self.reachable() if o else []:
            dx, dz = o["position"]["x"] - p["x"], o["position"]["z"] - p["z"]
            if math.hypot(dx, dz) <= 2.0:
                facing = round(math.degrees(math.atan2(dx, dz)) % 360 / 90) * 90 % 360
                poses.append(dict(x=p["x"], y=p["y"], z=p["z"], rotation=facing, standing=True, horizon=30.0))
        return self._event("", poses)

    def _do_Teleport(self, position: dict[str, float], rotation: dict[str, float] | None = None,
                     horizon: float | None = None, standing: bool | None = None) -> Event:
        spot = (round(position["x"], 2), round(position["z"], 2))
        free = {(p["x"], p["z"]) for p in self.reachable()}
        if spot not in free or spot in self.blocked_teleports:
            return self._event(f"teleport to {spot} is not possible")
        self.agent["position"] = dict(x=spot[0], y=AGENT_Y, z=spot[1])
        if rotation is not None:
            self.agent["rotation"] = dict(x=0.0, y=float(rotation["y"]) % 360, z=0.0)
        if horizon is not None:
            self.agent["cameraHorizon"] = float(horizon)
        if standing is not None:
            self.agent["isStanding"] = standing
        return self._event("")

    def _move(self, sign: float, moveMagnitude: float = 0.25) -> Event:
        yaw = math.radians(self.agent["rotation"]["y"])
        p = self.agent["position"]
        x, z = round(p["x"] + sign * moveMagnitude * math.sin(yaw), 2), round(p["z"] + sign * moveMagnitude * math.cos(yaw), 2)
        if (x, z) not in {(q["x"], q["z"]) for q in self.reachable()} or (x, z) in self.walls:
            return self._event("blocked")
        self.agent["position"] = dict(x=x, y=AGENT_Y, z=z)
        return self._event("")

    def _do_MoveAhead(self, moveMagnitude: float = 0.25) -> Event:
        return self._move(1, moveMagnitude)

    def _do_MoveBack(self, moveMagnitude: float = 0.25) -> Event:
        return self._move(-1, moveMagnitude)

    def _do_RotateLeft(self, degrees: float = 90) -> Event:
        self.agent["rotation"]["y"] = (self.agent["rotation"]["y"] - degrees) % 360
        return self._event("")

    def _do_RotateRight(self, degrees: float = 90) -> Event:
        self.agent["rotation"]["y"] = (self.agent["rotation"]["y"] + degrees) % 360
        return self._event("")

    def _do_LookUp(self, degrees: float = 30) -> Event:
        self.agent["cameraHorizon"] = max(-30.0, self.agent["cameraHorizon"] - degrees)
        return self._event("")

    def _do_LookDown(self, degrees: float = 30) -> Event:
        self.agent["cameraHorizon"] = min(60.0, self.agent["cameraHorizon"] + degrees)
        return self._event("")

    def _do_Crouch(self) -> Event:
        self.agent["isStanding"] = False
        return self._event("")

    def _do_Stand(self) -> Event:
        self.agent["isStanding"] = True
        return self._event("")

    def _near(self, objectId: str) -> tuple[dict[str, Any] | None, str]:
        o = self._by_id(objectId)
        if o is None:
            return None, f"no object {objectId}"
        if self._hidden(o) or self._flat(o) > 1.5:
            return None, f"{objectId} is not interactable"
        return o, ""

    def _do_PickupObject(self, objectId: str, forceAction: bool = False, manualInteract: bool = False) -> Event:
        o, error = self._near(objectId)
        if o is None or not o["pickupable"] or self.held:
            return self._event(error or "cannot pick up")
        for parent in o["parentReceptacles"] or []:
            self._by_id(parent)["receptacleObjectIds"].remove(objectId)
        o["isPickedUp"], o["parentReceptacles"], self.held = True, None, objectId
        return self._event("")

    def _do_PutObject(self, objectId: str, forceAction: bool = False, placeStationary: bool = True) -> Event:
        o, error = self._near(objectId)
        if o is None or not o["receptacle"] or not self.held or (o["openable"] and not o["isOpen"]):
            return self._event(error or "cannot put there")
        held = self._by_id(self.held)
        held["isPickedUp"], held["parentReceptacles"], held["position"] = False, [objectId], dict(o["position"])
        o["receptacleObjectIds"].append(self.held)
        self.held = None
        return self._event("")

    def _set(self, objectId: str, flag: str, able: str, value: bool) -> Event:
        o, error = self._near(objectId)
        if o is None or not o[able] or o[flag] == value:
            return self._event(error or f"cannot set {flag}")
        o[flag] = value
        return self._event("")

    def _do_OpenObject(self, objectId: str, openness: float = 1, forceAction: bool = False) -> Event:
        return self._set(objectId, "isOpen", "openable", True)

    def _do_CloseObject(self, objectId: str, forceAction: bool = False) -> Event:
        return self._set(objectId, "isOpen", "openable", False)

    def _do_ToggleObjectOn(self, objectId: str, forceAction: bool = False) -> Event:
        return self._set(objectId, "isToggled", "toggleable", True)

    def _do_ToggleObjectOff(self, objectId: str, forceAction: bool = False) -> Event:
        return self._set(objectId, "isToggled", "toggleable", False)

    def stop(self) -> None:
        self.stopped = True
