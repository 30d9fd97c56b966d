"""The benchmark's rules: task types and their groups, step limits, key actions and test cases."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from embodied_r.errors import TestCaseError

GROUPS: dict[str, tuple[str, ...]] = {
    "search": ("single_search", "single_search_from_closerep"),
    "manipulation": ("single_pickup", "single_pickup_from_closerep", "single_toggle"),
    "transport": ("pickup_and_put", "pickup_and_put_in_closerep", "pickup_from_closerep_and_put",
                  "pickup_from_closerep_and_put_in_closerep"),
    "composite": ("ordered_pickup_two_object_and_put", "long-range tasks with dependency relationships"),
}
TASK_TYPES: tuple[str, ...] = tuple(t for types in GROUPS.values() for t in types)
GROUP_OF: dict[str, str] = {t: g for g, types in GROUPS.items() for t in types}
# Test-set sizes per group in test_809.json (checked against the real file in the tests).
GROUP_COUNTS = {"search": 155, "manipulation": 299, "transport": 250, "composite": 105}

# The original's ``get_max_steps``; ``init`` counts as a step, a type it does not list gets 36.
_LIMITS = {"search": 22, "manipulation": 24, "transport": 30, "composite": 36}
DEFAULT_STEP_LIMIT = 36

ACTION_VERBS: tuple[str, ...] = ("init", "navigate to", "pickup", "put", "put in", "toggle", "open", "close",
                                 "observe", "move forward", "end")
# Verbs that move or look, never rewarded by the metric.
NON_INTERACTIVE: tuple[str, ...] = ("navigate to", "observe", "move forward")

SHARED_TEST_RELPATH = Path("benchmarks") / "embodied-reasoner" / "test_809.json"
_CHECKOUT = Path(__file__).resolve().parents[2]


def group_of(task_type: str) -> str:
    """The group of a task type; a variant (``_navigate_fault`` ...) takes its base type's group."""
    if task_type in GROUP_OF:
        return GROUP_OF[task_type]
    for base in sorted(GROUP_OF, key=len, reverse=True):
        if task_type.startswith(base):
            return GROUP_OF[base]
    return "composite"


def step_limit(task_type: str) -> int:
    return _LIMITS.get(group_of(task_type), DEFAULT_STEP_LIMIT)


def key_actions(task: dict[str, Any]) -> list[str]:
    """``"<action> <objectType>"`` for each action of the task's metadata (``"end"`` alone)."""
    return [f"{a['action']} {a.get('objectType', '')}".strip() for a in task["task_metadata"]["actions"]]


def shared_test_file(root: Path | None = None) -> Path | None:
    """The real test_809.json from ``../shared`` beside the checkout (or a worktree's parent)."""
    root = Path(root) if root else _CHECKOUT
    for base in (root.parent, root.parent.parent):
        candidate = base / "shared" / SHARED_TEST_RELPATH
        if candidate.is_file():
            return candidate
    return None


REQUIRED_KEYS = ("scene", "tasktype", "taskname", "taskquery", "task_metadata", "identity")


def load_test_cases(path: Path) -> list[dict[str, Any]]:
    """Every test case of a file like test_809.json, checked for the fields the loop reads."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise TestCaseError(f"{path}: expected a list of test cases")
    for i, case in enumerate(data):
        missing = [k for k in REQUIRED_KEYS if k not in case]
        if missing or "actions" not in case.get("task_metadata", {}):
            raise TestCaseError(f"{path}: case {i} lacks {missing or ['task_metadata.actions']}")
    return data


def counts(cases: Iterable[dict[str, Any]]) -> dict[str, Any]:
    cases = list(cases)
    types = Counter(c["tasktype"] for c in cases)
    verbs = Counter(a["action"] for c in cases for a in c["task_metadata"]["actions"])
    return {"cases": len(cases), "task_types": dict(types),
            "groups": {g: sum(types[t] for t in ts) for g, ts in GROUPS.items()},
            "verbs": dict(verbs), "scenes": len({c["scene"] for c in cases})}
