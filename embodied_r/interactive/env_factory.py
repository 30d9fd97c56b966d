"""Build the environment a config names; AI2-THOR is imported only when chosen."""

from __future__ import annotations

from typing import Any

from embodied_r.interactive.environment import Environment


def make_environment(kind: str, **kwargs: Any) -> Environment:
    """``builtin`` (the CPU household stand-in) or ``ai2thor`` (needs the extra and a GPU)."""
    if kind == "builtin":
        from embodied_r.interactive.household import HouseholdEnvironment

        return HouseholdEnvironment(**kwargs)
    if kind == "ai2thor":
        from embodied_r.interactive.ai2thor_env import AI2ThorEnvironment

        return AI2ThorEnvironment(**kwargs)
    raise ValueError(f"unknown environment {kind!r}; choose builtin or ai2thor")
