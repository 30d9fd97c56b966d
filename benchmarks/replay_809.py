"""Replay the key actions of the 809 test cases in the built-in house.

Each case's ``task_metadata.actions`` is played in order through the built-in household
environment (``interactive/household.py``), as a perfect agent would, then scored by the
original's metric. It prints how many cases succeed, and the cases that cannot, grouped by
why: the first illegal step and the environment's reason, the key actions' step count over the
task type's limit, or every step legal and the metric still short of 1 (a key action no agent
action can match). The figures say how far the built-in house's rules let the benchmark's own
solutions through, so its success rates mean what AI2-THOR's mean.

    python benchmarks/replay_809.py                       # ../shared/benchmarks/embodied-reasoner/test_809.json
    python benchmarks/replay_809.py --tests path/to/test_809.json --examples 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from embodied_r.interactive.household import HouseholdEnvironment  # noqa: E402
from embodied_r.interactive.metrics import episode_metrics  # noqa: E402
from embodied_r.interactive.tasks import key_actions, load_test_cases, shared_test_file, step_limit  # noqa: E402


def _step(action: dict[str, Any]) -> tuple[str, str | None]:
    verb, kind = action["action"], action.get("objectType") or None
    return verb, kind


def replay(case: dict[str, Any], out: Path) -> dict[str, Any]:
    """One case's replay: ``{"identity", "tasktype", "success", "why"}`` (why: None on success)."""
    env = HouseholdEnvironment()
    first = env.reset(case, out / str(case["identity"]))
    trajectory = [{"action": "init", "object": None, "legal_objects": first.legal_objects, "success": 1}]
    why = None
    for action in case["task_metadata"]["actions"]:
        verb, kind = _step(action)
        if verb == "end":
            break
        result = env.step(verb, kind)
        trajectory.append({"action": verb, "object": kind, "legal_objects": result.legal_objects,
                           "success": int(result.success)})
        if not result.success and why is None:
            # The reason without the case's own names, so that alike failures group together.
            reason = result.feedback.split("cannot be done: ", 1)[-1].rstrip(".")
            reason = re.sub(r"holds \w+", "holds <object>", reason)
            why = f"illegal {verb}: {reason}"
    trajectory.append({"action": "end", "object": None, "legal_objects": env.legal_objects(), "success": 1})
    env.close()
    keys = key_actions(case)
    metrics = episode_metrics(case, trajectory, keys)
    if why is None and len(trajectory) - 1 > step_limit(case["tasktype"]):
        why = f"more key actions than the step limit ({step_limit(case['tasktype'])})"
    if why is None and not metrics["success"]:
        unmatched = [k for k in keys if k.split(" ")[0] in ("put", "pickup", "open", "close", "toggle")
                     and " " not in k]
        why = ("every step legal, metric short of 1: key action with no object type "
               f"({', '.join(sorted(set(unmatched))) or '?'})")
    return {"identity": case["identity"], "tasktype": case["tasktype"], "success": metrics["success"],
            "completeness": metrics["completeness"], "why": why}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests", help="test_809.json (default: the shared copy beside the checkout)")
    parser.add_argument("--examples", type=int, default=3, help="case identities shown per group")
    parser.add_argument("--json", help="write every case's replay here")
    args = parser.parse_args(argv)
    path = Path(args.tests) if args.tests else shared_test_file(ROOT)
    if path is None or not path.is_file():
        print("skipped: no test_809.json (give --tests PATH, or put it in "
              "../shared/benchmarks/embodied-reasoner/ beside the checkout)")
        return 0
    cases = load_test_cases(path)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [replay(c, Path(tmp)) for c in cases]
    ok = sum(r["success"] for r in rows)
    print(f"{path}: {len(rows)} cases; the key actions replayed in the built-in house succeed in {ok} "
          f"({100 * ok / len(rows):.2f}%)")
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["why"]:
            groups[r["why"]].append(r)
    for why, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        types = sorted({m["tasktype"] for m in members})
        failed = sum(1 for m in members if not m["success"])
        print(f"  {len(members):4d} ({failed} not successful)  {why}\n"
              f"        task types: {', '.join(types)}; "
              f"e.g. {', '.join(str(m['identity']) for m in members[:args.examples])}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
