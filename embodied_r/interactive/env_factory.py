"""The environments a config names (AI2-THOR imported only when chosen) and the pool of AI2-THOR controllers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from embodied_r.interactive.environment import Environment


class ControllerPool:
    """Controllers lent to one episode at a time (a controller holds one scene: two episodes on it
    would both play in the one loaded last); at most ``batch`` run at once."""

    def __init__(self, start: Callable[[], Any]):
        self.start = start
        self.idle: list[Any] = []
        self.started: list[Any] = []

    def take(self) -> Any:
        if self.idle:
            return self.idle.pop()
        controller = self.start()
        self.started.append(controller)
        return controller

    def give(self, controller: Any) -> None:
        self.idle.append(controller)

    def stop(self) -> None:
        for controller in self.started:
            controller.stop()
        self.started, self.idle = [], []


class EnvironmentMaker:

    def __init__(self, kind: str, original_checkout: str | Path | None = None,
                 start_controller: Callable[[], Any] | None = None):
        self.kind = kind
        self.pool: ControllerPool | None = None
        if kind == "ai2thor":
            from embodied_r.interactive import ai2thor_env, ai2thor_poses

            # Read first, so a missing poses file stops the run before any Unity launch.
            self.poses = ai2thor_poses.load_poses(original_checkout)
            self.pool = ControllerPool(start_controller or ai2thor_env.start_controller)
        elif kind != "builtin":
            raise ValueError(f"unknown environment {kind!r}; choose builtin or ai2thor")

    def __call__(self) -> Environment:
        if self.pool is None:
            from embodied_r.interactive.household import HouseholdEnvironment

            return HouseholdEnvironment()
        from embodied_r.interactive.ai2thor_env import AI2ThorEnvironment

        return AI2ThorEnvironment(controller=self.pool.take(), poses=self.poses, release=self.pool.give)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.stop()
