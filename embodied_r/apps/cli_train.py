"""``embodied-r sft``: the SFT baseline, trained and evaluated beside the pipeline."""

from __future__ import annotations

import argparse
import time
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sft",
        help="SFT baseline: fine-tune on the recipe's converted records, then evaluate like the pipeline",
        description="Supervised fine-tuning baseline on the convert stage's records (run "
                    "`embodied-r convert --recipe R` first), evaluated on the recipe's test split; "
                    "both logged to MLflow under one parent run.",
    )
    p.add_argument("--recipe", default="demo", help="recipe name or YAML path (default %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe value, e.g. --set training.use_cpu=true")
    p.add_argument("--model", default=None, help="initial model (default: the recipe's training.policy)")
    p.add_argument("--epochs", type=float, default=None, help="SFT epochs")
    p.add_argument("--learning-rate", type=float, default=None, help="SFT learning rate")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--refresh", action="store_true", help="retrain and re-evaluate even when done before")
    p.set_defaults(handler=cmd_sft)


def _updates(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {"epochs": args.epochs, "learning_rate": args.learning_rate, "max_steps": args.max_steps}
    return {k: v for k, v in pairs.items() if v is not None}


def cmd_sft(args: argparse.Namespace) -> int:
    from embodied_r.config import load_recipe, parse_overrides
    from embodied_r.lifecycle.sft_baseline import sft_baseline, sft_config_for
    from embodied_r.pipeline import plan

    recipe = load_recipe(args.recipe, parse_overrides(args.set) or None)
    cfg = sft_config_for(recipe, **_updates(args))
    started = time.time()
    result = sft_baseline(recipe, plan(recipe), cfg, init_model=args.model, refresh=args.refresh)
    sft, evaluation = result["sft"], result["evaluation"]
    print(f"\nSFT baseline done in {time.time() - started:.1f} s.")
    print(f"  model       {result['stages']['sft']}/model  ({sft.get('steps')} steps, "
          f"{sft.get('done')} records, {sft.get('failed')} too long)")
    print(f"  evaluation  {result['stages']['sft_evaluate']}")
    if "accuracy/overall" in evaluation:
        from embodied_r.scoring.metrics import format_accuracy, summary_interval

        print("\nTest accuracy [95 % interval]: " + ", ".join(
            f"{name} {format_accuracy(evaluation[key], summary_interval(evaluation, key))}"
            for name, key in (("overall", "accuracy/overall"), ("average over categories", "accuracy/macro"))
            if isinstance(evaluation.get(key), (int, float))))
    print(f"MLflow store: {result['tracking_uri']}  (parent run {result['mlflow_run_id']})")
    return 0
