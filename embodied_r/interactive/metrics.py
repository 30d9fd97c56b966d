"""Episode metrics exactly as the original evaluator computes them, and their aggregation.

An episode's ``trajectory`` is a list of steps ``{"action", "object", "legal_objects",
"success"}`` that starts with the ``init`` step. Rules (from the original ``metric``):

- total = the key actions other than navigate/observe/move forward; ``end`` is included;
- +1 for each successful pickup/put/open/close/toggle that matches a key action not yet
  matched, in any order (``put in`` counts as ``put``); a repeated key action
  (``pickup Lettuce`` three times) scores once per occurrence;
- +1 at a successful ``end``; for ``single_search`` only when one of the end step's legal
  object types occurs in the task name, or else when the last successful action is a key
  action (then the count stops there);
- failed steps score nothing and do not change "the last successful action";
- success = int(reward / total), completeness = reward / total,
  efficiency = (len(key_actions) + 1) / len(trajectory) when successful, else 0.

All functions here are pure.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from embodied_r.interactive.tasks import GROUPS, NON_INTERACTIVE, group_of

METRICS = ("success", "efficiency", "completeness")
# Steps that never score; "error" is an unparseable reply.
_UNSCORED = ("init", "observe", "move forward", "navigate to", "error")


def total_reward(key_actions: list[str]) -> int:
    return sum(1 for k in key_actions if not any(v in k for v in NON_INTERACTIVE))


def _named(action: str, item: str | None) -> str:
    return f"{action} {item}" if item is not None else action


def episode_metrics(task: dict[str, Any], trajectory: list[dict[str, Any]],
                    key_actions: list[str]) -> dict[str, float]:
    """``{"success", "efficiency", "completeness"}`` of one episode (see the module doc)."""
    unmatched = list(key_actions)
    task_type, task_name = task["tasktype"], task["taskname"]
    reward = 0
    previous = ""
    for step in trajectory:
        action, item = step["action"], step.get("object")
        legal, ok = step.get("legal_objects") or [], bool(step.get("success"))
        if action in _UNSCORED or not ok:
            if ok:
                previous = _named(action, item)
            continue
        if "end" in action:
            if task_type == "single_search":
                if any(obj.lower() in task_name.lower() for obj in legal):
                    reward += 1
                elif previous in key_actions:
                    reward += 1
                    break
            else:
                reward += 1
        elif item is not None:
            if action.startswith("put"):
                action = "put"
            if _named(action, item) in unmatched:
                unmatched.remove(_named(action, item))
                reward += 1
        previous = _named(action, item)
    total = total_reward(key_actions)
    if total == 0:
        raise ValueError(f"task {task.get('identity')} has no scoring key action (not even 'end')")
    success = int(reward / total)
    return {
        "success": success,
        "efficiency": (len(key_actions) + 1) / len(trajectory) if success else 0.0,
        "completeness": reward / total,
    }


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {m: sum(r[m] for r in rows) / len(rows) for m in METRICS} if rows else {}


def aggregate(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Plain means over episodes (a failure counts with efficiency 0): overall, per group and
    per task type. Each result holds ``tasktype`` and the three metrics."""
    results = list(results)
    by_type: dict[str, list] = defaultdict(list)
    by_group: dict[str, list] = defaultdict(list)
    for r in results:
        by_type[r["tasktype"]].append(r)
        by_group[group_of(r["tasktype"])].append(r)
    return {
        "episodes": len(results),
        "all": _mean(results),
        "groups": {g: {**_mean(by_group[g]), "episodes": len(by_group[g])} for g in GROUPS if by_group[g]},
        "task_types": {t: {**_mean(rows), "episodes": len(rows)} for t, rows in sorted(by_type.items())},
    }


# Paper, Table 2: success rate / search efficiency / task completeness, in percent.
PAPER_TABLE2: dict[str, tuple[float, float, float]] = {
    "Embodied-Reasoner-7B": (80.96, 55.07, 86.30),
    "Embodied-Reasoner-3B": (73.67, 50.88, 83.34),
    "Embodied-Reasoner-2B": (59.09, 40.05, 72.04),
    "OpenAI o1": (71.73, 43.06, 82.49),
    "GPT-4o": (66.67, 41.68, 79.07),
    "Qwen2.5-VL-72B": (31.75, 22.61, 50.62),
}


def table2(summary: dict[str, Any], name: str = "this run") -> str:
    """A Markdown table of this run beside the paper's Table 2 (percentages), per group too."""
    lines = ["| model | SR | SE | TC |", "|---|---:|---:|---:|"]
    for model, (sr, se, tc) in PAPER_TABLE2.items():
        lines.append(f"| {model} (paper) | {sr:.2f} | {se:.2f} | {tc:.2f} |")
    overall = summary.get("all") or {}
    if overall:
        lines.append(f"| **{name}** | {100 * overall['success']:.2f} | {100 * overall['efficiency']:.2f} | "
                     f"{100 * overall['completeness']:.2f} |")
    lines += ["", "| group | episodes | SR | SE | TC |", "|---|---:|---:|---:|---:|"]
    for group, row in summary.get("groups", {}).items():
        lines.append(f"| {group} | {row['episodes']} | {100 * row['success']:.2f} | "
                     f"{100 * row['efficiency']:.2f} | {100 * row['completeness']:.2f} |")
    return "\n".join(lines) + "\n"


def flat_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """``success/all``, ``success/search``, ..., ``completeness/type/<task type>`` for MLflow."""
    out: dict[str, float] = {}
    for m in METRICS:
        if summary.get("all"):
            out[f"{m}/all"] = summary["all"][m]
        for group, row in summary.get("groups", {}).items():
            out[f"{m}/{group}"] = row[m]
        for task_type, row in summary.get("task_types", {}).items():
            out[f"{m}/type/{task_type.replace(' ', '_')}"] = row[m]
    return out
