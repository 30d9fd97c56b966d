"""The interface every house the agent acts in implements, built-in or AI2-THOR, and a step's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class StepResult:
    success: bool
    images: list[str] = field(default_factory=list)  # absolute paths, in the order shown
    legal_objects: list[str] = field(default_factory=list)
    feedback: str = ""  # why an action failed, in the environment's own words


class Environment(Protocol):
    def reset(self, task: dict[str, Any], out_dir: Path) -> StepResult:
        """Load the task's scene, place the agent and return the first view (the ``init`` step)."""

    def step(self, action: str, obj: str | None = None) -> StepResult:
        """Execute ``action`` (never ``end``: the episode decides it) on object type ``obj``; an
        action illegal by ``legality`` fails without acting."""

    def object_types(self) -> list[str]:
        """Every object type in the scene: what an unknown name in a reply is matched against."""

    def close(self) -> None: ...
