"""The interface every house the agent acts in implements, built-in or AI2-THOR.

``reset(task, out_dir)`` starts an episode and returns the first observation (the ``init``
step); ``step(action, obj)`` runs one action on a resolved object type and returns whether
it succeeded, the new image or images, the object types the agent may act on now and, for
an illegal action, the feedback the agent is given. Both implementations judge legality by
the original agent's rules in ``legality.py``; an illegal action fails without acting. ``object_types()`` is the candidate
list that an unknown object name in a reply is matched against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Verbs the environment executes; "end" is decided by the episode loop, never executed.
EXECUTED = ("init", "navigate to", "pickup", "put", "put in", "toggle", "open", "close", "observe", "move forward")
NO_OBJECT = ("init", "observe", "move forward", "end")


@dataclass
class StepResult:
    success: bool
    images: list[str] = field(default_factory=list)  # absolute paths, in the order shown
    legal_objects: list[str] = field(default_factory=list)
    feedback: str = ""  # why an illegal action failed, in the environment's own words


class Environment(Protocol):
    def reset(self, task: dict[str, Any], out_dir: Path) -> StepResult:
        """Load the task's scene, place the agent and return the first view."""

    def step(self, action: str, obj: str | None = None) -> StepResult:
        """Execute ``action`` (a verb of ``EXECUTED``) on object type ``obj``."""

    def object_types(self) -> list[str]:
        """Every object type in the current scene, the candidates for name matching."""

    def close(self) -> None: ...
