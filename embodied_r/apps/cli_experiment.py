"""``embodied-r experiment NAME``: an experiment's variants at several seeds, compared."""

from __future__ import annotations

import argparse
import time


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.replace(" ", "").split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: give integers separated by commas, e.g. 42,1,2") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="run an experiment's variants at several seeds and compare them "
                                          "on the same questions (--list shows them)")
    p.add_argument("name", nargs="?", help="a packaged experiment (--list) or the path of one in YAML")
    p.add_argument("--recipe", default="demo", help="recipe name or YAML path (default %(default)s)")
    p.add_argument("--seeds", type=_seeds, default=None, metavar="S1,S2,...",
                   help="training seeds, each run of every variant (default: the recipe's own)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe value for every variant")
    p.add_argument("--source", metavar="DIR",
                   help="take the benchmarks from a local mirror laid out like the hub repos")
    p.add_argument("--list", action="store_true", help="list the packaged experiments")
    p.set_defaults(handler=cmd_experiment)


def cmd_experiment(args: argparse.Namespace) -> int:
    from embodied_r.apps.cli import _all_overrides
    from embodied_r.experiments.spec import available_experiments, load_experiment

    if args.list or not args.name:
        for name in available_experiments():
            spec = load_experiment(name)
            print(f"{name:12s} {spec.description}")
        return 0
    from embodied_r import paths
    from flows.experiment import experiment, plans, plans_to_json

    overrides = _all_overrides(args)
    spec = load_experiment(args.name)
    seeds = list(dict.fromkeys(args.seeds)) if args.seeds else [None]
    # Every variant checked and planned once, before anything runs: the flow takes these.
    planned = plans(spec, args.recipe, seeds, overrides, paths.home())
    start = time.time()
    result = experiment(name=args.name, recipe=args.recipe, seeds=args.seeds, overrides=overrides or None,
                        planned=plans_to_json(planned))
    print(f"\nDone in {time.time() - start:.1f} s.\n")
    for line in result["lines"]:
        print(line)
    print(f"\nMLflow store: {result['tracking_uri']}  (experiment run {result['mlflow_run_id']})")
    print(f"This experiment in MLflow: {result['mlflow_run_url']}")
    print(f"Its variants side by side: {result['mlflow_compare_url']}")
    print(f"The table: {result['table_file']}")
    return 0
