"""Episode metrics exactly as the original evaluator computes them, their aggregation and Table 2; pure."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable

from embodied_r.interactive.tasks import GROUPS, NON_INTERACTIVE, group_of

METRICS = ("success", "efficiency", "completeness", "completeness_ordered", "repeat_rate")
# Steps that never score; "error" is an unparseable reply.
_UNSCORED = ("init", "observe", "move forward", "navigate to", "error")


def scoring_actions(key_actions: list[str]) -> list[str]:
    return [k for k in key_actions if not any(v in k for v in NON_INTERACTIVE)]


def total_reward(key_actions: list[str]) -> int:
    return len(scoring_actions(key_actions))


def _named(action: str, item: str | None) -> str:
    return f"{action} {item}" if item is not None else action


def episode_metrics(task: dict[str, Any], trajectory: list[dict[str, Any]],
                    key_actions: list[str]) -> dict[str, float]:
    return all_metrics(task, trajectory, key_actions)[0]


def extra_metrics(task: dict[str, Any], trajectory: list[dict[str, Any]],
                  key_actions: list[str]) -> dict[str, float]:
    return all_metrics(task, trajectory, key_actions)[1]


def all_metrics(task: dict[str, Any], trajectory: list[dict[str, Any]],
                key_actions: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """``episode_metrics`` and ``extra_metrics`` of a trajectory from its ``init`` step, scored once."""
    reward, scored = _score(task, trajectory, key_actions)
    ordered = scoring_actions(key_actions)
    total = len(ordered)
    if total == 0:
        raise ValueError(f"task {task.get('identity')} has no scoring key action (not even 'end')")
    success = int(reward / total)
    main = {
        "success": success,
        "efficiency": (len(key_actions) + 1) / len(trajectory) if success else 0.0,
        "completeness": reward / total,
    }
    if task["tasktype"] == "single_search":
        completeness_ordered = reward / total
    else:
        completeness_ordered = lcs_length(scored, ordered) / total
    visited = [s.get("object") for s in trajectory if s["action"] == "navigate to"]
    repeat = (len(visited) - len(set(visited))) / len(visited) if visited else 0.0
    return main, {"completeness_ordered": completeness_ordered, "repeat_rate": repeat,
                  "key_action_steps": key_action_steps(task, key_actions)}


def lcs_length(a: list[str], b: list[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def key_action_steps(task: dict[str, Any], key_actions: list[str]) -> int:
    # The original counts the closed-receptacle search as 2 whatever its metadata lists.
    return 2 if task["tasktype"] == "single_search_from_closerep" else len(key_actions) - 1


def step_bucket(steps: int) -> str:
    return str(steps) if steps < 9 else "9+"


def _score(task: dict[str, Any], trajectory: list[dict[str, Any]],
           key_actions: list[str]) -> tuple[int, list[str]]:
    """The reward and the actions that scored, in order; each key action scores once per occurrence,
    in any order (``put in`` as ``put``), failed steps never."""
    unmatched = list(key_actions)
    scored: list[str] = []
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
                scored.append(action)
        elif item is not None:
            if action.startswith("put"):
                action = "put"
            if _named(action, item) in unmatched:
                unmatched.remove(_named(action, item))
                scored.append(_named(action, item))
                reward += 1
        previous = _named(action, item)
    return reward, scored


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
    # Only figures every row has: results written before a figure existed lack it.
    return {m: sum(r[m] for r in rows) / len(rows) for m in METRICS if all(m in r for r in rows)} if rows else {}


def aggregate(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Plain means over episodes: overall, per group, per task type, and success by number of key
    actions; a result marked ``dropped`` (its generation failed) is only counted."""
    results = list(results)
    dropped = [r for r in results if r.get("dropped")]
    results = [r for r in results if not r.get("dropped")]
    by_type: dict[str, list] = defaultdict(list)
    by_group: dict[str, list] = defaultdict(list)
    by_steps: dict[str, list] = defaultdict(list)
    for r in results:
        by_type[r["tasktype"]].append(r)
        by_group[group_of(r["tasktype"])].append(r)
        if "key_action_steps" in r:
            by_steps[step_bucket(r["key_action_steps"])].append(r["success"])
    order = sorted(by_steps, key=lambda b: (b == "9+", b))
    return {
        "episodes": len(results),
        "dropped": len(dropped),
        "dropped_by_type": dict(sorted(Counter(r["tasktype"] for r in dropped).items())),
        "all": _mean(results),
        "groups": {g: {**_mean(by_group[g]), "episodes": len(by_group[g])} for g in GROUPS if by_group[g]},
        "task_types": {t: {**_mean(rows), "episodes": len(rows)} for t, rows in sorted(by_type.items())},
        "by_key_actions": {b: {"success": sum(by_steps[b]) / len(by_steps[b]), "episodes": len(by_steps[b])}
                           for b in order},
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


def _pct(row: dict[str, Any], m: str) -> str:
    return f"{100 * row[m]:.2f}" if m in row else "-"


def table2(summary: dict[str, Any], name: str = "this run") -> str:
    lines = ["| model | SR | SE | TC |", "|---|---:|---:|---:|"]
    for model, (sr, se, tc) in PAPER_TABLE2.items():
        lines.append(f"| {model} (paper) | {sr:.2f} | {se:.2f} | {tc:.2f} |")
    overall = summary.get("all") or {}
    if overall:
        lines.append(f"| **{name}** | {_pct(overall, 'success')} | {_pct(overall, 'efficiency')} | "
                     f"{_pct(overall, 'completeness')} |")
    lines += ["", "| group | episodes | SR | SE | TC | ordered TC | repeat rate |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    rows = list(summary.get("groups", {}).items()) + ([("all", {**overall, "episodes": summary["episodes"]})]
                                                       if overall else [])
    for group, row in rows:
        lines.append(f"| {group} | {row['episodes']} | " + " | ".join(_pct(row, m) for m in METRICS) + " |")
    if summary.get("by_key_actions"):
        lines += ["", "| key actions | episodes | SR |", "|---|---:|---:|"]
        for bucket, row in summary["by_key_actions"].items():
            lines.append(f"| {bucket} | {row['episodes']} | {100 * row['success']:.2f} |")
    if summary.get("dropped"):
        by_type = ", ".join(f"{t} {n}" for t, n in summary.get("dropped_by_type", {}).items())
        lines += ["", f"Dropped (failed generation, left out of every mean): {summary['dropped']} "
                      f"episodes ({by_type})."]
    return "\n".join(lines) + "\n"


def flat_metrics(summary: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in METRICS:
        if m in (summary.get("all") or {}):
            out[f"{m}/all"] = summary["all"][m]
        for group, row in summary.get("groups", {}).items():
            if m in row:
                out[f"{m}/{group}"] = row[m]
        for task_type, row in summary.get("task_types", {}).items():
            if m in row:
                out[f"{m}/type/{task_type.replace(' ', '_')}"] = row[m]
    for bucket, row in summary.get("by_key_actions", {}).items():
        out[f"success/key_actions/{bucket.replace('+', '_plus')}"] = row["success"]
    if "dropped" in summary:
        out["dropped"] = summary["dropped"]
    return out
