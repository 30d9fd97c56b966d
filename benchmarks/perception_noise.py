"""How good must the perceiver be? The demo trained at several action error rates.

Runs the demo recipe's stages in this process (no Prefect, no MLflow) once per action error
rate of the world perceiver, its other error rates as the recipe sets them, in one home so
that the benchmark, key frames and catalog are made once. For each rate it prints the test
accuracy of the warm-started and the GRPO-trained reasoner, the ceiling (a scripted reader of
the perception text alone) and chance, and plots them against the error rate.

    python benchmarks/perception_noise.py                          # rates 0, 0.2, 0.4
    python benchmarks/perception_noise.py --rates 0 0.1 0.2 0.4 0.6 --home /tmp/noise --png noise.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def accuracy(folder: str) -> float:
    """Recomputed from the predictions, numeric answers by their score."""
    import pyarrow.parquet as pq

    rows = pq.read_table(Path(folder) / "predictions.parquet").to_pylist()
    return sum(float(r["score"]) for r in rows) / len(rows) if rows else 0.0


def one_rate(rate: float, recipe: str, seed: int | None) -> dict:
    from embodied_r.experiments.spec import seed_overrides
    from embodied_r.config import load_recipe
    from embodied_r.demo.ceiling import ceiling
    from embodied_r.paths import home
    from embodied_r.pipeline import execute, plan

    base = load_recipe(recipe).perception.backend.world
    overrides = {"perception": {"backend": {"world": {**base, "action_error_rate": rate}}}}
    if seed is not None:
        overrides.update(seed_overrides(seed))
    stages = plan(load_recipe(recipe, overrides), home())
    for sp in stages.values():
        execute(sp)
    top = ceiling(Path(stages["preprocess"].out) / "catalog.parquet", Path(stages["perception"].out))
    return {"action_error_rate": rate, "warmstart": accuracy(stages["evaluate_warmstart"].out),
            "trained": accuracy(stages["evaluate"].out), "ceiling": top["accuracy"], "chance": top["chance"],
            "questions": top["questions"]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r["action_error_rate"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, style in (("ceiling", "k--"), ("trained", "o-"), ("warmstart", "s:"), ("chance", "k:")):
        ax.plot(rates, [100 * r[key] for r in rows], style, label=key)
    ax.set_xlabel("world perceiver: action error rate")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(loc="lower right", ncol=2)  # below the curves, above nothing
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.2, 0.4])
    parser.add_argument("--seed", type=int, default=None, help="trainers' seed (default the recipe's)")
    parser.add_argument("--home", help="project home (default: a temporary folder)")
    parser.add_argument("--png", default="perception_noise.png")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    os.environ["EMBODIED_R_HOME"] = args.home or tempfile.mkdtemp(prefix="er-noise-")
    rows = []
    print(f"{'action errors':>13} {'warm start':>10} {'trained':>8} {'ceiling':>8} {'chance':>7}")
    for rate in args.rates:
        row = one_rate(rate, args.recipe, args.seed)
        rows.append(row)
        print(f"{rate:13.2f} {100 * row['warmstart']:9.1f}% {100 * row['trained']:7.1f}% "
              f"{100 * row['ceiling']:7.1f}% {100 * row['chance']:6.1f}%", flush=True)
    plot(rows, Path(args.png))
    print(f"plot: {args.png}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
