"""The ``Environment`` interface on AI2-THOR 5.0.0 (the ``ai2thor`` extra), by the original evaluator's agent rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from embodied_r.errors import AI2ThorUnavailable
from embodied_r.interactive import ai2thor_poses as poses_mod
from embodied_r.interactive.environment import StepResult
from embodied_r.interactive.legality import Legality, seen_in

CONTROLLER_ARGS: dict[str, Any] = dict(
    snapToGrid=False, quality="Medium", agentMode="default", massThreshold=None, scene="FloorPlan1",
    visibilityDistance=20, gridSize=0.1, renderDepthImage=False, renderInstanceSegmentation=False,
    width=800, height=450, fieldOfView=90,
)
MOVE = 0.5  # metres per "move forward" and per fallback step
VIEWS = ("left view", "back view", "right view")
BORDER = 5  # black pixels either side of the middle view


def start_controller(**overrides: Any) -> Any:
    try:
        from ai2thor.controller import Controller
        from ai2thor.platform import CloudRendering
    except ImportError as exc:
        raise AI2ThorUnavailable("install the extra: pip install 'embodied-r[ai2thor]' "
                                 "(ai2thor==5.0.0), on a machine with a GPU and Vulkan") from exc
    try:
        return Controller(platform=CloudRendering, **{**CONTROLLER_ARGS, **overrides})
    except Exception as exc:  # noqa: BLE001 - no display, no Vulkan, no build download
        raise AI2ThorUnavailable(f"AI2-THOR did not start: {exc}") from exc


class AI2ThorEnvironment:
    """One episode on its own controller; ``poses`` is ``ai2thor_poses.load_poses``'s map."""

    def __init__(self, controller: Any, poses: dict[str, dict[str, dict[str, Any]]], release: Any = None,
                 max_retries: int = 20):
        self.c = controller
        self.poses = poses
        self.release = release  # called with the controller when the episode closes
        self.max_retries = max_retries  # the original retries a failed teleport without end
        self.out = Path(".")
        self.steps = 0
        self.task: dict[str, Any] = {}
        self.targets: dict[str, str] = {}
        self.legality = Legality()

    @property
    def meta(self) -> dict[str, Any]:
        return self.c.last_event.metadata

    def _ok(self) -> bool:
        return self.meta.get("errorMessage", "") == ""

    def _object(self, oid: str) -> dict[str, Any] | None:
        return next((o for o in self.meta["objects"] if o["objectId"] == oid), None)

    def _item(self, kind: str) -> dict[str, Any] | None:
        if kind in self.targets:
            return self._object(self.targets[kind])
        return next((o for o in self.meta["objects"] if o["objectType"] == kind), None)

    def object_types(self) -> list[str]:
        return list(dict.fromkeys(o["objectType"] for o in self.meta["objects"]))

    def _frame(self, name: str) -> str:
        from PIL import Image

        path = self.out / f"{self.steps:03d}_{name.replace(' ', '_')}.png"
        Image.fromarray(self.c.last_event.frame).save(path, format="PNG")
        return str(path.resolve())

    def _done(self, ok: bool, name: str, feedback: str = "") -> StepResult:
        """A move that failed leaves the lists as they were (the original returns none)."""
        if not ok:
            return self._refuse(feedback)
        self.legality.observe(seen_in(self.meta))
        return StepResult(True, [self._frame(name)], self.legality.legal_objects)

    def _refuse(self, feedback: str) -> StepResult:
        return StepResult(False, [], self.legality.legal_objects, feedback)

    def _teleport(self, pos: dict[str, float], yaw: float, horizon: float) -> bool:
        self.c.step(action="Teleport", position=dict(x=pos["x"], y=pos["y"], z=pos["z"]),
                    rotation=dict(x=0, y=yaw, z=0), horizon=horizon)
        return self._ok()

    def _first_teleport(self, find: Callable[[list[dict[str, Any]]], Any], horizon: float) -> bool:
        """Teleport to the first pose ``find(tried)`` gives that takes, within ``max_retries``."""
        tried: list[dict[str, Any]] = []
        for _ in range(self.max_retries):
            found = find(tried)
            if found is None:
                return False
            if self._teleport(found[0], found[1], horizon):
                return True
            tried.append(found[0])
        return False

    def _start(self) -> bool:
        corners = self.meta["sceneBounds"]["cornerPoints"]
        reachable = self.c.step(action="GetReachablePositions").metadata.get("actionReturn") or []
        return self._first_teleport(lambda tried: poses_mod.start_pose(corners, reachable, tried), 0)

    def _navigate(self, item: dict[str, Any]) -> bool:
        # To an open receptacle holding one of the task's related objects: to that object.
        if item.get("receptacle") and not item.get("openable"):
            inside = item.get("receptacleObjectIds") or []
            related = next((r for r in self.task.get("related_objects") or [] if r in inside), None)
            item = (self._object(related) or item) if related else item
        fixed = self.poses.get(self.task.get("scene", ""), {}).get(item["objectId"])
        if fixed is not None:
            # The original teleports to the hand-made pose as it is: no crouch, no look-at.
            ok = self._teleport(fixed["agent_teleport_position"], fixed["agent_rotation"]["y"],
                                fixed["agent_cameraHorizon"])
        else:
            ok = self._computed_pose(item)
        if ok and item.get("receptacle"):
            self.legality.enter(oid.split("|")[0] for oid in item.get("receptacleObjectIds") or [])
        return ok

    def _computed_pose(self, item: dict[str, Any]) -> bool:
        interactable = self.c.step(action="GetInteractablePoses", objectId=item["objectId"]).metadata.get(
            "actionReturn") or []
        if not self._first_teleport(lambda tried: poses_mod.navigation_pose(item, interactable, tried),
                                    poses_mod.NAV_HORIZON):
            return False
        lowest = min(p[1] for p in item["axisAlignedBoundingBox"]["cornerPoints"])
        agent = self.meta["agent"]
        self.c.step(action="Crouch" if poses_mod.crouch(agent["position"]["y"], lowest) else "Stand")
        if not (self._object(item["objectId"]) or {}).get("visible"):
            self.c.step(action="Stand")
        agent = self.meta["agent"]
        up, left = poses_mod.look_at(self.meta["cameraPosition"], item["axisAlignedBoundingBox"]["center"],
                                     agent["cameraHorizon"], agent["rotation"]["y"])
        if up > 0:
            self.c.step(action="LookUp", degrees=up)
        elif up < 0:
            self.c.step(action="LookDown", degrees=-up)
        self.c.step(action="RotateLeft", degrees=left)
        return True

    def _sideways(self, direction: str) -> bool:
        """One step to a side, facing as before (the original's turn, step, turn back)."""
        turn, back = ("RotateRight", "RotateLeft") if direction == "right" else ("RotateLeft", "RotateRight")
        self.c.step(action=turn, degrees=90)
        self.c.step(action="MoveAhead", moveMagnitude=MOVE)
        ok = self._ok()
        self.c.step(action=back, degrees=90)
        return ok

    def _move_forward(self) -> bool:
        """MoveAhead; when blocked a sideways step (toward the nearer visible related object when both
        sides are free), then a step back, then turning right and left."""
        self.c.step(action="MoveAhead", moveMagnitude=MOVE)
        if self._ok():
            return True
        if self.task.get("related_objects"):
            right_ok = self._sideways("right")
            at_right = dict(self.meta["agent"]["position"])
            if right_ok:
                self._sideways("left")  # back where it was
            left_ok = self._sideways("left")
            at_left = dict(self.meta["agent"]["position"])
            if left_ok:
                self._sideways("right")
            if right_ok and left_ok:
                near = [o["position"] for o in (self._object(r) for r in self.task["related_objects"])
                        if o is not None and o.get("visible")]
                if near:
                    d_r = min(poses_mod._flat(at_right, p) for p in near)
                    d_l = min(poses_mod._flat(at_left, p) for p in near)
                    return self._sideways("right" if d_r < d_l else "left")
            if right_ok or left_ok:
                return self._sideways("right" if right_ok else "left")
        else:
            if self._sideways("right") or self._sideways("left"):
                return True
        self.c.step(action="MoveBack", moveMagnitude=MOVE)
        if self._ok():
            return True
        self.c.step(action="RotateRight", degrees=90)
        turned = self._ok()
        self.c.step(action="MoveAhead", moveMagnitude=MOVE)
        if self._ok():
            return True
        if turned:
            self.c.step(action="RotateLeft", degrees=180)
        self.c.step(action="MoveAhead", moveMagnitude=MOVE)
        return self._ok()

    def _observe(self) -> StepResult:
        import numpy as np
        from PIL import Image, ImageDraw, ImageFont

        views = []
        for label in VIEWS:
            self.c.step(action="RotateLeft", degrees=90)
            self.legality.observe(seen_in(self.meta), interactions=False)
            img = Image.fromarray(self.c.last_event.frame).convert("RGB")
            draw = ImageDraw.Draw(img)
            font = ImageFont.load_default(size=max(12, img.height // 15))
            draw.text((10, img.height - 20), label, fill=(0, 0, 255), font=font, anchor="ls")
            views.append(np.asarray(img))
        middle = np.pad(views[1], ((0, 0), (BORDER, BORDER), (0, 0)))
        path = self.out / f"{self.steps:03d}_observe.png"
        Image.fromarray(np.concatenate([views[0], middle, views[2]], axis=1)).save(path, format="PNG")
        self.c.step(action="RotateLeft", degrees=90)
        self.legality.observe(seen_in(self.meta), navigable=False)
        return StepResult(self._ok(), [str(path.resolve())], self.legality.legal_objects)

    def reset(self, task: dict[str, Any], out_dir: Path) -> StepResult:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.steps, self.task = 0, task
        self.c.reset(scene=task["scene"], **{k: v for k, v in CONTROLLER_ARGS.items() if k not in ("scene", "gridSize")})
        self.targets = {}
        for oid in task.get("target_objects") or []:
            self.targets.setdefault(oid.split("|")[0], oid)
        self.legality = Legality.for_task(task)
        if not self._start():
            return self._refuse("no reachable start position in this scene.")
        return self._done(True, "init")

    def step(self, action: str, obj: str | None = None) -> StepResult:
        self.steps += 1
        if action == "observe":
            return self._observe()
        if action == "move forward":
            return self._done(self._move_forward(), "move_forward", "something blocks the way.")
        if obj is None:
            return self._refuse(f"{action} needs an object.")
        item = self._item(obj)
        if item is None:
            return self._refuse(f"there is no {obj} in this room.")
        if not self.legality.allows(action, obj):
            why = "not navigable from here" if action == "navigate to" else "not available for interaction here"
            return self._refuse(f"{obj} is {why}.")
        if action == "navigate to":
            if not self._navigate(item):
                return self._refuse(f"{obj} cannot be reached.")
            return self._done(True, f"navigate_{obj}")
        oid = item["objectId"]
        if action == "toggle":
            state = bool(item.get("isToggled"))
            self.c.step(action="ToggleObjectOff" if state else "ToggleObjectOn", objectId=oid, forceAction=False)
        elif action == "pickup":
            self.c.step(action="PickupObject", objectId=oid, forceAction=False, manualInteract=False)
        elif action in ("put", "put in"):
            self.c.step(action="PutObject", objectId=oid, forceAction=False, placeStationary=True)
        elif action == "open":
            self.c.step(action="OpenObject", objectId=oid, openness=1, forceAction=False)
        elif action == "close":
            self.c.step(action="CloseObject", objectId=oid, forceAction=False)
        else:
            return self._refuse("unknown action.")
        # The original updates its lists after an executed interaction, failed or not.
        ok = self._ok()
        self.legality.observe(seen_in(self.meta))
        return StepResult(ok, [self._frame(f"{action}_{obj}")] if ok else [], self.legality.legal_objects,
                          "" if ok else f"{obj} is not reachable for {action}: {self.meta.get('errorMessage', '')[:200]}")

    def close(self) -> None:
        if self.release is not None:
            self.release(self.c)
            self.release = None
