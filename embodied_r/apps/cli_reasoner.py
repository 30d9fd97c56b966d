"""Embodied-Reasoner commands: ``embodied-r reasoner`` runs its pipeline; ``embodied-r
reasoner-eval`` evaluates any checkpoint on the built-in household environment or in AI2-THOR."""

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
    p.add_argument("--seed", type=int, default=None,
                   help="the SFT trainers' and the sampling seed (the data stay the same); default the recipe's")
    p.set_defaults(handler=cmd_reasoner)

    e = subparsers.add_parser("reasoner-eval", help="evaluate a checkpoint on interactive tasks")
    e.add_argument("model", help="model folder, hub id, tiny:vlm, or the served name with --set backend.kind=openai")
    e.add_argument("--environment", choices=["builtin", "ai2thor"], default="builtin")
    e.add_argument("--tests", help="a test-case file like test_809.json (default: the recipe's data stage)")
    e.add_argument("--limit", type=int, default=None, help="first N test cases")
    e.add_argument("--recipe", default="reasoner-demo")
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    e.add_argument("--out", default=None, help="output folder (default a new one under the home); the same "
                   "--out again resumes an interrupted evaluation where it stopped")
    e.set_defaults(handler=cmd_reasoner_eval)


def is_reasoner_recipe(name_or_path: str) -> bool:
    import yaml

    from embodied_r.config import REASONER_RECIPES as RECIPES

    path = Path(name_or_path)
    if not path.is_file():
        return (RECIPES / f"{name_or_path}.yaml").is_file()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return False  # the recipe loader says where it stops parsing, in its one line
    return isinstance(data, dict) and bool({"sft", "explore", "sft_stages"} & set(data))


def validate_reasoner(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from embodied_r.config import load_reasoner as load, parse_overrides
    from embodied_r.errors import RecipeError

    try:
        recipe = load(args.recipe, parse_overrides(args.set))
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors())
        raise RecipeError(f"recipe {args.recipe!r} does not validate: {wrong}") from None
    except ValueError as exc:
        raise RecipeError(str(exc)) from None
    if problem := recipe.backend.unready(needs_model=False):
        raise RecipeError(problem)
    print(json.dumps(recipe.model_dump(mode="json"), indent=2) if args.show else f"{recipe.name}: valid")
    return 0


def _check_matcher(recipe: Any) -> None:
    """An embedding matcher whose model is not here stops a run before its first stage."""
    from embodied_r.errors import RecipeError
    from embodied_r.interactive.matching import embedding_model_problem

    episode = recipe.evaluate.episode
    if episode.matcher == "embedding" and (problem := embedding_model_problem(episode.embedding_model)):
        raise RecipeError(problem)


def seed_overrides(seed: int) -> dict[str, Any]:
    """The SFT trainers' data order and the sampling seed, not the synthetic sample's: every seed
    learns from and is tested on the same tasks."""
    return {"sft": {"seed": seed}, "backend": {"seed": seed}}


def _print_learning(stages: dict[str, str]) -> None:
    from embodied_r.io import is_complete, read_summary

    lines = []
    for name, out in stages.items():
        if not name.startswith("reasoner_sft_") or not is_complete(Path(out)):
            continue
        s = read_summary(Path(out))
        acc, loss = s.get("token_accuracy") or {}, s.get("loss") or {}
        if acc.get("first") is None:
            lines.append(f"  {name.removeprefix('reasoner_sft_'):12s} {s.get('steps', 0):5d} steps: none logged "
                         "(fewer than sft.logging_steps)")
            continue
        rate = (f"; learning rate {s['learning_rate']:.1e} after {s['warmup_steps']} warm-up steps (highest "
                f"logged {s['peak_learning_rate']:.1e})" if "warmup_steps" in s else "")
        lines.append(f"  {name.removeprefix('reasoner_sft_'):12s} {s['steps']:5d} steps on "
                     f"{s['train_conversations']:4d} conversations: token accuracy {acc['first']:.3f} -> {acc['last']:.3f}, loss "
                     f"{loss['first']:.2f} -> {loss['last']:.2f}{rate}")
    if lines:
        print("\nSFT stages, on their own data (first -> last quarter of the steps):")
        print("\n".join(lines))


def _print_references(summary: dict[str, Any], trained_here: bool = True) -> None:
    from embodied_r.interactive.reference import verdict
    from embodied_r.scoring.metrics import accuracy_interval, format_accuracy

    # The means leave out dropped episodes (a failed generation under ``drop``).
    found, m = summary.get("reference"), summary.get("metrics", {})
    n = int(summary.get("episodes", 0)) - int(summary.get("dropped") or 0)
    if not found or "success/all" not in m or not n:
        return
    ceiling, free = found["ceiling"], found["free"]
    success, completeness = m["success/all"], m["completeness/all"]
    print(f"\n{'policy':34s} {'success':>22s} {'completeness':>13s}")
    print(f"{'scripted ceiling (key actions)':34s} {100 * ceiling['success']:20.1f} % "
          f"{100 * ceiling['completeness']:11.1f} %")
    print(f"{'SFT-trained agent' if trained_here else 'the model':34s} {format_accuracy(success, accuracy_interval(success * n, n)):>22s} "
          f"{100 * completeness:11.1f} %")
    print(f"{'free point (end at once)':34s} {100 * free['success']:20.1f} % {100 * free['completeness']:11.1f} %")
    print(verdict(success, completeness, n, ceiling, free, trained_here))


def _print_metrics(summary: dict[str, Any]) -> None:
    m = summary.get("metrics", {})
    names = {"success": "SR", "efficiency": "SE", "completeness": "TC", "completeness_ordered": "TC-ord",
             "repeat_rate": "repeat"}
    print(f"{'group':14s} " + " ".join(f"{n:>7s}" for n in names.values()))
    for group in ("all", "search", "manipulation", "transport", "composite"):
        if f"success/{group}" in m:
            print(f"{group:14s} " + " ".join(f"{100 * m[f'{k}/{group}']:7.2f}" if f"{k}/{group}" in m else f"{'-':>7s}"
                                             for k in names))
    if m.get("dropped"):
        print(f"dropped (failed generation, left out of every mean): {int(m['dropped'])} episodes")


def cmd_reasoner(args: argparse.Namespace) -> int:
    from embodied_r import paths
    from embodied_r.config import load_reasoner as load, parse_overrides
    from embodied_r.merge import deep_merge
    from embodied_r.pipeline import plan
    from flows.reasoner import embodied_reasoner

    # A bad recipe fails before Prefect starts, and the run's plan is made once, here.
    overrides = parse_overrides(args.set)
    if args.seed is not None:
        overrides = deep_merge(overrides, seed_overrides(args.seed))
    recipe = load(args.recipe, overrides)
    stages = plan(recipe, paths.home())
    if not args.only or any("evaluate" in stage for stage in args.only):
        _check_matcher(recipe)
    started = time.time()
    result = embodied_reasoner(recipe=args.recipe, only=args.only, refresh=args.refresh,
                               overrides=overrides or None, home=str(paths.home()), plan=stages.to_json())
    print(f"\nEmbodied-Reasoner pipeline done in {time.time() - started:.1f} s.")
    for name, out in result["stages"].items():
        print(f"  {name:26s} {out}")
    _print_learning(result["stages"])
    if result.get("evaluation"):
        print("\nEvaluation (percent; the paper's Table 2 is in the evaluate stage's report.md):")
        _print_metrics(result["evaluation"])
        _print_references(result["evaluation"])
    print(f"MLflow store: {result['tracking_uri']}  (parent run {result['mlflow_run_id']})")
    return 0


def cmd_reasoner_eval(args: argparse.Namespace) -> int:
    from embodied_r import paths
    from embodied_r.config import load_reasoner as load, parse_overrides
    from embodied_r.interactive.stages import run_evaluate_stage
    from embodied_r.interactive.tasks import load_test_cases

    recipe = load(args.recipe, parse_overrides(args.set))
    _check_matcher(recipe)
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
        from embodied_r.pipeline import execute, plan

        data = plan(recipe)["reasoner_data"]
        execute(data)
        catalog = Path(data.out)
    evaluate = recipe.evaluate.model_copy(update={"environment": args.environment, "limit": args.limit})
    summary = run_evaluate_stage(out / "evaluation", {"evaluate": evaluate.model_dump(mode="json"),
                                                      "backend": recipe.backend.model_dump(mode="json"),
                                                      "torch_threads": recipe.torch_threads},
                                 {"catalog": str(catalog), "model": args.model})
    print(f"{summary['episodes']} episodes in {summary['seconds']} s; report {out / 'evaluation' / 'report.md'}")
    _print_metrics(summary)
    _print_references(summary, trained_here=False)
    return 0
