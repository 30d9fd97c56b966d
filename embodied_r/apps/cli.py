"""The ``embodied-r`` command."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any



def stage_commands() -> dict[str, str]:
    """One command per Embodied-R stage kind, with its help line."""
    from embodied_r.stage_kinds import kinds

    return {k.name: k.help for k in kinds("embodied-r") if k.command}


def _setup_env(home: str | None) -> None:
    if home:
        os.environ["EMBODIED_R_HOME"] = str(Path(home).expanduser().resolve())
    # Prefect's telemetry fails offline and leaves "database is locked" tracebacks.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect logs a failed task's traceback at ERROR; the CLI prints the error itself in
    # one line (``--debug`` shows everything).
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL")
    # The ephemeral API server's 20 s start budget is too short on a loaded machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    # OpenCV warns once per frame its writer drops ("Failed to write frame"): hundreds of lines
    # on a full disk, which the stage names in one line (``synthetic.world``).
    os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # Our own bars only: MLflow's "Downloading artifacts" bar would interleave with them.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def _all_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``--set`` pairs, plus ``--source DIR`` as a local mirror of the benchmarks."""
    from embodied_r.config import parse_overrides
    from embodied_r.merge import deep_merge
    from embodied_r.experiments.spec import seed_overrides

    merged = parse_overrides(args.set)
    if getattr(args, "seed", None) is not None:
        from embodied_r.config import raw_recipe

        # Read as written: the run validates the recipe once, with the seed in it.
        warm = raw_recipe(args.recipe, merged or None).get("warmstart") is not None
        merged = deep_merge(merged, seed_overrides(args.seed, warm))
    if getattr(args, "source", None):
        merged = deep_merge(merged, {"download": {
            "source": "local", "source_dir": str(Path(args.source).expanduser().resolve())}})
    return merged


# Whether the figures show learning is the learning block's verdict to say, from the figures.
DEMO_CAVEAT = ("The demo's models are tiny and its benchmark synthetic: these figures show the method "
               "in miniature, not the paper's results. Running it for real: docs/running.md.")
HEADLINE = ("overall", "macro", "paper_tasks")


def _print_ceiling(result: dict[str, Any], recipe: Any) -> None:
    """With the demo's world perceiver: what a scripted reader of the perception text alone
    scores on the evaluated split, the most a reasoner could read out of that text."""
    stages = result.get("stages") or {}
    if not recipe.perception.backend.stand_in or not {"preprocess", "perception"} <= set(stages):
        return
    from embodied_r.demo.ceiling import ceiling
    from embodied_r.scoring.metrics import accuracy_interval, format_accuracy

    found = ceiling(Path(stages["preprocess"]) / "catalog.parquet", Path(stages["perception"]),
                    recipe.evaluation.split)
    n = found["questions"]
    print(f"Ceiling: a scripted reader of the perception text alone (no model) answers "
          f"{format_accuracy(found['accuracy'], accuracy_interval(found['accuracy'] * n, n))} of the "
          f"{n} {found['split']} questions with options; chance {100 * found['chance']:.1f} %; each task's "
          f"commonest train letter, text unread, {100 * found['prior']:.1f} % (a guess among the answers "
          f"each task has: {100 * found['answer_chance']:.1f} %)")


def _print_outcome(result: dict[str, Any], seconds: float, synthetic: bool = False,
                   recipe: Any = None) -> None:
    from embodied_r.paths import home

    print(f"\nDone in {seconds:.1f} s.")
    cached = result.get("cached") or []
    if cached:
        print(f"Served from cache: {', '.join(cached)}")
    for name, out in result.get("stages", {}).items():
        print(f"  {name:14s} {out}")
    evaluation = result.get("evaluation") or {}
    if "accuracy/overall" in evaluation:
        print("\nTest accuracy [95 % interval]: " + ", ".join(
            f"{k} {_accuracy(evaluation, f'accuracy/{k}')}" for k in HEADLINE
            if isinstance(evaluation.get(f"accuracy/{k}"), (int, float))))
        # One line per task (the keys with a question count); subtypes are in the report.
        print(f"  {'task':28s} {'questions':>9s}  accuracy [95 % interval]")
        for key, value in sorted(evaluation.items()):
            task = key[len("accuracy/"):]
            if (key.startswith("accuracy/") and "/" not in task and task not in HEADLINE
                    and f"count/{task}" in evaluation and isinstance(value, (int, float))):
                print(f"  {task:28s} {int(evaluation[f'count/{task}']):9d}  {_accuracy(evaluation, key)}")
    _print_learning(evaluation)
    if recipe is not None:
        _print_ceiling(result, recipe)
    if synthetic:
        print(DEMO_CAVEAT)
    if result.get("promotion"):
        print(f"\nRegistry: {result['promotion']}")
    uri = result.get("tracking_uri", "")
    if result.get("tracking_lost"):
        print(f"\nProject home: {home()}")
        _print_log()
        return
    print(f"\nMLflow store: {uri}  (parent run {result.get('mlflow_run_id')})")
    if uri.startswith("sqlite:"):
        print(f"Open its UI:  mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000")
    print(f"Project home: {home()}")
    _print_log()
    if result.get("mlflow_run_url"):
        print(f"This run in MLflow: {result['mlflow_run_url']}")
    if result.get("mlflow_runs_url"):
        print(f"All runs, headline columns: {result['mlflow_runs_url']}")
    if result.get("mlflow_run_url"):
        from embodied_r.tracking.names import SIDEBAR_HINT

        print(SIDEBAR_HINT)


def _print_log() -> None:
    from embodied_r.apps.console import run_log

    if (log := run_log()) is not None:
        print(f"Run log:      {log}  (the libraries' own messages)")


def _accuracy(summary: dict[str, Any], key: str) -> str:
    from embodied_r.scoring.metrics import format_accuracy, summary_interval

    return format_accuracy(summary[key], summary_interval(summary, key))


def _print_learning(evaluation: dict[str, Any]) -> None:
    from embodied_r.evaluation.learning import learning_block

    for line in learning_block(evaluation):
        print(line)


def _precheck(args: argparse.Namespace, stage: str | None, overrides: dict[str, Any]) -> Any:
    """Catch a bad recipe or a missing input before Prefect starts, with a short message;
    returns the run's plan, made here once and handed to the flow."""
    from embodied_r.config import backend_problems, load_recipe
    from embodied_r.errors import RecipeError
    from embodied_r.pipeline import plan
    from embodied_r.tracking.store import check_store, tracking_uri

    recipe = load_recipe(args.recipe, overrides or None)
    stages = plan(recipe)
    refresh = getattr(args, "refresh", None) or []
    for name in refresh:
        stages.resolve(name)
    selected = stages.select([stage] if stage is not None else None)
    # A backend that cannot start is named now, not when its stage comes.
    refreshing = bool(refresh) or bool(getattr(args, "refresh_stage", False))
    needed = {stages[n].kind for n in selected if refreshing or not stages[n].complete}
    if problems := backend_problems(recipe, needed):
        raise RecipeError("; ".join(problems))
    check_store(tracking_uri(recipe.tracking.tracking_uri))
    return recipe, stages


def _cmd_run(args: argparse.Namespace, stage: str | None = None) -> int:
    from flows.pipeline import embodied_r
    from flows.stages import STAGE_FLOWS

    from contextlib import nullcontext

    from embodied_r import progress

    overrides = _all_overrides(args)
    recipe, stages = _precheck(args, stage, overrides)
    start = time.time()
    bars = progress.listening(progress.TerminalBar()) if sys.stderr.isatty() else nullcontext()
    with bars:
        if stage is None:
            result = embodied_r(recipe=args.recipe, refresh=args.refresh or None, overrides=overrides or None,
                                plan=stages.to_json())
        else:
            result = STAGE_FLOWS[stage](recipe=args.recipe, refresh=args.refresh_stage, overrides=overrides or None,
                                        plan=stages.to_json())
    _print_outcome(result, time.time() - start, recipe.download.source == "synthetic", recipe)
    if result.get("tracking_lost"):
        # The work is done and on disk; its record in MLflow is not complete.
        print(f"error: {result['tracking_lost']}", file=sys.stderr)
        return 1
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from embodied_r.config import load_recipe
    from embodied_r.io import damaged_outputs
    from embodied_r.pipeline import plan
    from embodied_r.code_keys import stage_modules
    from embodied_r.stage_kinds import kind_of

    stages = plan(load_recipe(args.recipe, _all_overrides(args) or None))
    only = stages.resolve(args.modules) if args.modules else None
    for name, sp in stages.items():
        if only not in (None, name):
            continue
        state = "done" if sp.complete else ("partial" if Path(sp.out + ".partial").exists() else "to do")
        if sp.complete and damaged_outputs(Path(sp.out)):
            state = "damaged"  # lost a file since it finished: the next run does it again or names --refresh
        print(f"{name:14s} {state:8s} {sp.out}")
        if args.modules is not None:
            print("".join(f"    {m}\n" for m in stage_modules(kind_of(sp.kind).runner, sp.config, sp.inputs)), end="")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from embodied_r.apps.cli_reasoner import is_reasoner_recipe, validate_reasoner
    from embodied_r.config import backend_problems, load_recipe
    from embodied_r.errors import RecipeError
    from embodied_r.tracking.store import check_store, tracking_uri

    if is_reasoner_recipe(args.recipe):
        return validate_reasoner(args)
    recipe = load_recipe(args.recipe, _all_overrides(args) or None)
    if problems := backend_problems(recipe):
        raise RecipeError("; ".join(problems))
    check_store(tracking_uri(recipe.tracking.tracking_uri))
    print(json.dumps(recipe.model_dump(mode="json"), indent=2) if args.show else f"{recipe.name}: valid")
    return 0


def _cmd_recipes(_: argparse.Namespace) -> int:
    from embodied_r.config import available_recipes, description

    for name in available_recipes():
        print(f"{name:12s} {description(name)}")
    return 0


# Modules that add their own sub-commands: each has ``register(subparsers)`` and sets a
# ``handler(args) -> int`` default on the parsers it adds.
EXTENSIONS: tuple[str, ...] = ("embodied_r.apps.cli_data", "embodied_r.apps.cli_eval", "embodied_r.apps.cli_train",
                               "embodied_r.apps.cli_reasoner", "embodied_r.apps.cli_models",
                               "embodied_r.apps.cli_prompts", "embodied_r.apps.cli_experiment", "embodied_r.checks.gpu")


def build_parser(stages: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embodied-r", description=__doc__)
    parser.add_argument("--home", help="project home (default $EMBODIED_R_HOME or ~/.embodied-r)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--no-wait", action="store_true",
                        help="when another run holds a stage of this home, stop at once instead of waiting")
    sub = parser.add_subparsers(dest="command", required=True)

    def recipe_args(p: argparse.ArgumentParser, default: str = "demo") -> None:
        p.add_argument("--recipe", default=default, help="recipe name or YAML path (default %(default)s)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a recipe value, e.g. --set training.learning_rate=1e-6")
        p.add_argument("--source", metavar="DIR",
                       help="take the benchmarks from a local mirror laid out like the hub repos")

    demo = sub.add_parser("demo", help="run the whole pipeline on the embedded default (CPU, offline)")
    demo.set_defaults(recipe="demo", set=[], refresh=[])
    demo.add_argument("--refresh", action="append", default=[], metavar="STAGE")
    demo.add_argument("--seed", type=int, default=None,
                      help="training and sampling seed of the warm start and the GRPO stages (the "
                           "benchmark stays the same); default the recipe's")
    run = sub.add_parser("run", help="run the whole pipeline with a recipe")
    recipe_args(run)
    run.add_argument("--refresh", action="append", default=[], metavar="STAGE",
                     help="recompute STAGE and every stage after it (repeatable)")
    for name, text in (stage_commands() if stages else {}).items():
        p = sub.add_parser(name, help=text)
        recipe_args(p)
        p.add_argument("--refresh", dest="refresh_stage", action="store_true",
                       help="recompute this stage (and discard what depends on it)")
        p.set_defaults(stage=name)
    plan_p = sub.add_parser("plan", help="list the stages, their output folders and whether they are done")
    recipe_args(plan_p)
    plan_p.add_argument("--modules", nargs="?", const="", metavar="STAGE",
                        help="also list the library modules in each stage's key (or in STAGE's alone)")
    val = sub.add_parser("validate", help="check a recipe")
    recipe_args(val)
    val.add_argument("--show", action="store_true", help="print the full resolved recipe")
    sub.add_parser("recipes", help="list the recipes shipped with the package")
    moved = sub.add_parser("relocate", help="rewrite the paths a copied or moved project home records (--home)")
    # Also after the command, as the moved home's error message writes it.
    moved.add_argument("--home", default=argparse.SUPPRESS, help="the home to relocate")
    import importlib

    for module in EXTENSIONS:
        importlib.import_module(module).register(sub)
    return parser


def _cmd_relocate(args: argparse.Namespace) -> int:
    from embodied_r.lifecycle.relocate import relocate_home
    from embodied_r.paths import home

    counts = relocate_home(home())
    print(f"home {counts['to']} (was {counts['from']}): rewrote {counts['parquet']} Parquet files, "
          f"{counts['text']} JSON files, {counts['duckdb']} DuckDB values and {counts['sqlite']} "
          "MLflow store values")
    return 0


def _command_word(argv: list[str]) -> str | None:
    words = iter(argv)
    for word in words:
        if word == "--home":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _parse(argv: list[str] | None) -> argparse.Namespace:
    # The stage commands come from the stage declarations, which build every config model: a
    # command that is none of them parses without them, so that it starts at once.
    light = build_parser(stages=False)
    fixed = next(a for a in light._actions if isinstance(a, argparse._SubParsersAction)).choices
    if _command_word(sys.argv[1:] if argv is None else argv) in fixed:
        return light.parse_args(argv)
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.debug:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    _setup_env(args.home)
    if args.no_wait:
        os.environ["EMBODIED_R_LOCK"] = "fail"
    if argv is None and args.command != "chat":
        # A real command line: Ctrl-C and SIGTERM stop it at once, in one line (chat reads
        # Ctrl-C as "leave the conversation", and saves it).
        from embodied_r.apps.interrupt import install

        install()
    stage = getattr(args, "stage", None)
    if argv is None and (args.command in ("demo", "run") or stage):
        # A real command line: whatever it starts (Prefect's server included) ends with it.
        from embodied_r.apps.prefect_watch import start_watch
        from embodied_r.apps.reaper import start_reaper

        start_reaper()
        # And a Prefect API that goes away stops it in one line, not minutes of retries.
        start_watch()
    from embodied_r.paths import claim_home

    try:
        if args.command == "relocate":
            return _cmd_relocate(args)
        if args.command not in ("recipes", "validate"):
            claim_home()
        if args.command not in ("recipes", "validate", "plan"):
            from embodied_r.apps.console import own_console

            own_console(args.command)
        if getattr(args, "handler", None) is not None:
            return args.handler(args)
        if args.command in ("demo", "run"):
            return _cmd_run(args)
        if stage:
            return _cmd_run(args, stage=stage)
        return {"plan": _cmd_plan, "validate": _cmd_validate, "recipes": _cmd_recipes}[args.command](args)
    except Exception as exc:  # noqa: BLE001 - one line for the user; --debug shows the traceback
        if args.debug:
            raise
        from embodied_r.explain import said

        line, status = said(exc, args.command)
        print(f"error: {line}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
