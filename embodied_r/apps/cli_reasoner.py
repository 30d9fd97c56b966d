"""Embodied-Reasoner commands: ``embodied-r reasoner`` runs its pipeline (the
``embodied-reasoner`` flow); ``embodied-r reasoner-eval`` evaluates any checkpoint on the
built-in household environment or in AI2-THOR.

An extension of ``embodied_r.apps.cli``: ``register(subparsers)`` adds the sub-commands.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("reasoner", help="run the Embodied-Reasoner pipeline (data, 3 SFT stages, "
                                               "rejection sampling, evaluation)")
    p.add_argument("--recipe", default="reasoner-demo", help="reasoner recipe name or YAML (default %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe value")
    p.add_argument("--only", nargs="+", metavar="STAGE", help="run only these stages (e.g. evaluate, sft_correction)")
    p.add_argument("--refresh", nargs="+", metavar="STAGE", help="recompute these stages and what follows them")
    p.set_defaults(handler=cmd_reasoner)

    e = subparsers.add_parser("reasoner-eval", help="evaluate a checkpoint on interactive tasks")
    e.add_argument("model", help="model folder, hub id, tiny:vlm, or the served name with --set backend.kind=openai")
    e.add_argument("--environment", choices=["builtin", "ai2thor"], default="builtin")
    e.add_argument("--tests", help="a test-case file like test_809.json (default: the recipe's data stage)")
    e.add_argument("--limit", type=int, default=None, help="first N test cases")
    e.add_argument("--recipe", default="reasoner-demo")
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    e.add_argument("--out", default=None, help="output folder (default under the home)")
    e.set_defaults(handler=cmd_reasoner_eval)


def _overrides(pairs: list[str]) -> dict[str, Any]:
    from embodied_r.config import deep_merge, parse_override

    out: dict[str, Any] = {}
    for pair in pairs:
        out = deep_merge(out, parse_override(pair))
    return out


def _print_metrics(summary: dict[str, Any]) -> None:
    m = summary.get("metrics", {})
    print(f"{'group':14s} {'SR':>7s} {'SE':>7s} {'TC':>7s}")
    for group in ("all", "search", "manipulation", "transport", "composite"):
        if f"success/{group}" in m:
            print(f"{group:14s} {100 * m[f'success/{group}']:7.2f} {100 * m[f'efficiency/{group}']:7.2f} "
                  f"{100 * m[f'completeness/{group}']:7.2f}")


def cmd_reasoner(args: argparse.Namespace) -> int:
    from embodied_r import paths
    from embodied_r.interactive.recipe import load, plan
    from flows.reasoner import embodied_reasoner

    # A bad recipe fails before Prefect starts; planning here also hashes the code once,
    # before Prefect's threads run (CPython 3.11's ast.parse is not safe beside them).
    plan(load(args.recipe, _overrides(args.set)), paths.home())
    started = time.time()
    result = embodied_reasoner(recipe=args.recipe, only=args.only, refresh=args.refresh,
                               overrides=_overrides(args.set) or None, home=str(paths.home()))
    print(f"\nEmbodied-Reasoner pipeline done in {time.time() - started:.1f} s.")
    for name, out in result["stages"].items():
        print(f"  {name:26s} {out}")
    if result.get("evaluation"):
        print("\nEvaluation (percent; the paper's Table 2 is in the evaluate stage's report.md):")
        _print_metrics(result["evaluation"])
    print(f"MLflow store: {result['tracking_uri']}  (parent run {result['mlflow_run_id']})")
    return 0


def cmd_reasoner_eval(args: argparse.Namespace) -> int:
    from embodied_r import paths
    from embodied_r.interactive.recipe import load
    from embodied_r.interactive.stages import run_evaluate_stage
    from embodied_r.interactive.tasks import load_test_cases

    recipe = load(args.recipe, _overrides(args.set))
    out = Path(args.out or paths.home() / "reasoner-eval" / time.strftime("%Y%m%d-%H%M%S"))
    catalog = out / "tests"
    if args.tests:
        import pyarrow as pa

        from embodied_r.interactive.catalog import TEST_CASES
        from embodied_r.interactive.tasks import group_of, key_actions, step_limit
        from embodied_r.io import write_parquet_atomic

        rows = [{"identity": int(c["identity"]), "scene": c["scene"], "task_type": c["tasktype"],
                 "group": group_of(c["tasktype"]), "taskname": c["taskname"], "taskquery": c["taskquery"],
                 "key_actions": key_actions(c), "step_limit": step_limit(c["tasktype"]), "case": json.dumps(c)}
                for c in load_test_cases(Path(args.tests))]
        write_parquet_atomic(pa.Table.from_pylist(rows, TEST_CASES), catalog / "test_cases.parquet")
    else:
        from embodied_r.interactive.recipe import plan
        from embodied_r.pipeline import execute

        data = plan(recipe)["reasoner_data"]
        execute(data)
        catalog = Path(data.out)
    evaluate = recipe.evaluate.model_copy(update={"environment": args.environment, "limit": args.limit})
    summary = run_evaluate_stage(out / "evaluation", {"evaluate": evaluate.model_dump(mode="json"),
                                                      "backend": recipe.backend.model_dump(mode="json")},
                                 {"catalog": str(catalog), "model": args.model})
    print(f"{summary['episodes']} episodes in {summary['seconds']} s; report {out / 'evaluation' / 'report.md'}")
    _print_metrics(summary)
    return 0
