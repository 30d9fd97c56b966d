"""The ``Environment`` interface on AI2-THOR 5.0.0, with the original evaluator's settings.

Optional: ``pip install 'embodied-r[ai2thor]'``. AI2-THOR downloads a ~500 MB Unity build at
run time (or finds it under ``~/.ai2thor/releases/``) and renders with Vulkan on a GPU
(``CloudRendering``); it cannot run on the CPU machines this project is developed on, so
this adapter is written against the documented Controller API and not exercised by the
tests. The built-in household environment implements the same interface on a CPU.

Mapping (as the evaluator's agent does it): ``navigate to`` teleports to the nearest
interactable pose of the object (within 1.5 m when one exists) and looks at it;
``pickup`` -> PickupObject; ``put``/``put in`` -> PutObject(placeStationary); ``open`` ->
OpenObject(openness=1); ``close`` -> CloseObject; ``toggle`` -> ToggleObjectOn/Off by the
object's state; ``observe`` -> three 90-degree left turns joined into one image, then a
fourth turn back; ``move forward`` -> MoveAhead(0.5). Success is an empty errorMessage.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from embodied_r.interactive.environment import StepResult

CONTROLLER_ARGS: dict[str, Any] = dict(
    snapToGrid=False, quality="Medium", agentMode="default", massThreshold=None, scene="FloorPlan1",
    visibilityDistance=20, gridSize=0.1, renderDepthImage=False, renderInstanceSegmentation=False,
    width=800, height=450, fieldOfView=90,
)


class AI2ThorUnavailable(RuntimeError):
    """ai2thor is not installed, or its build cannot start here (no GPU, no Vulkan)."""


class AI2ThorEnvironment:
    def __init__(self, controller: Any = None, **overrides: Any):
        if controller is None:
            try:
                from ai2thor.controller import Controller
                from ai2thor.platform import CloudRendering
            except ImportError as exc:
                raise AI2ThorUnavailable("install the extra: pip install 'embodied-r[ai2thor]' "
                                         "(ai2thor==5.0.0), on a machine with a GPU and Vulkan") from exc
            try:
                controller = Controller(platform=CloudRendering, **{**CONTROLLER_ARGS, **overrides})
            except Exception as exc:  # noqa: BLE001 - no display, no Vulkan, no build download
                raise AI2ThorUnavailable(f"AI2-THOR did not start: {exc}") from exc
        self.c = controller
        self.out = Path(".")
        self.steps = 0
        self.targets: dict[str, str] = {}

    # -- helpers ----------------------------------------------------------------------

    @property
    def event(self) -> Any:
        return self.c.last_event

    def _objects(self) -> list[dict[str, Any]]:
        return self.event.metadata["objects"]

    def _id(self, kind: str) -> str | None:
        """The task's own target of that type first, else the first object of the type."""
        if kind in self.targets:
            return self.targets[kind]
        return next((o["objectId"] for o in self._objects() if o["objectType"] == kind), None)

    def _ok(self) -> bool:
        return self.event.metadata.get("errorMessage", "") == ""

    def legal_objects(self) -> list[str]:
        return list(dict.fromkeys(o["objectType"] for o in self._objects() if o.get("visible")))

    def object_types(self) -> list[str]:
        return [o["objectType"] for o in self._objects()]

    def _frame(self, name: str) -> str:
        from PIL import Image

        path = self.out / f"{self.steps:03d}_{name.replace(' ', '_')}.png"
        Image.fromarray(self.event.frame).save(path)
        return str(path.resolve())

    def _result(self, ok: bool, name: str, feedback: str = "") -> StepResult:
        images = [self._frame(name)] if ok else []
        return StepResult(ok, images, self.legal_objects(), feedback if not ok else "")

    # -- the interface ----------------------------------------------------------------

    def reset(self, task: dict[str, Any], out_dir: Path) -> StepResult:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.steps = 0
        self.c.reset(scene=task["scene"], **{k: v for k, v in CONTROLLER_ARGS.items() if k not in ("scene", "gridSize")})
        self.targets = {}
        for oid in task.get("target_objects") or []:
            self.targets.setdefault(oid.split("|")[0], oid)
        return self._result(True, "init")

    def _navigate(self, oid: str) -> bool:
        obj = next(o for o in self._objects() if o["objectId"] == oid)
        poses = self.c.step(action="GetInteractablePoses", objectId=oid).metadata.get("actionReturn") or []
        if not poses:
            return False
        centre = obj["axisAlignedBoundingBox"]["center"]
        near = [p for p in poses if math.dist((p["x"], p["z"]), (centre["x"], centre["z"])) <= 1.5] or poses
        pose = min(near, key=lambda p: math.dist((p["x"], p["z"]), (centre["x"], centre["z"])))
        self.c.step(action="Teleport", position=dict(x=pose["x"], y=pose["y"], z=pose["z"]),
                    rotation=dict(x=0, y=pose["rotation"], z=0), horizon=pose.get("horizon", 30),
                    standing=pose.get("standing", True))
        return self._ok()

    def step(self, action: str, obj: str | None = None) -> StepResult:
        self.steps += 1
        if action == "observe":
            import numpy as np
            from PIL import Image

            frames = []
            for _ in range(3):
                self.c.step(action="RotateLeft", degrees=90)
                frames.append(self.event.frame)
            self.c.step(action="RotateLeft", degrees=90)
            path = self.out / f"{self.steps:03d}_observe.png"
            Image.fromarray(np.concatenate(frames, axis=1)).save(path)
            return StepResult(True, [str(path.resolve())], self.legal_objects())
        if action == "move forward":
            self.c.step(action="MoveAhead", moveMagnitude=0.5)
            return self._result(self._ok(), "move_forward", "something blocks the way.")
        oid = self._id(obj) if obj else None
        if oid is None:
            return self._result(False, action, f"there is no {obj} in this room.")
        calls = {
            "pickup": dict(action="PickupObject", objectId=oid, forceAction=False),
            "put": dict(action="PutObject", objectId=oid, forceAction=False, placeStationary=True),
            "put in": dict(action="PutObject", objectId=oid, forceAction=False, placeStationary=True),
            "open": dict(action="OpenObject", objectId=oid, openness=1, forceAction=False),
            "close": dict(action="CloseObject", objectId=oid, forceAction=False),
        }
        if action == "navigate to":
            return self._result(self._navigate(oid), f"navigate_{obj}", f"{obj} cannot be reached.")
        if action == "toggle":
            state = next((o.get("isToggled") for o in self._objects() if o["objectId"] == oid), False)
            self.c.step(action="ToggleObjectOff" if state else "ToggleObjectOn", objectId=oid, forceAction=False)
        elif action in calls:
            self.c.step(**calls[action])
        else:
            return self._result(False, action, "unknown action.")
        return self._result(self._ok(), f"{action}_{obj}", f"{obj} is not reachable for {action}: "
                            f"{self.event.metadata.get('errorMessage', '')[:200]}")

    def close(self) -> None:
        # One controller serves many episodes; the owner stops it.
        pass

    def stop(self) -> None:
        self.c.stop()
