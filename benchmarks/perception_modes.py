"""VLM calls and tokens of the two perception modes on the same catalog.

Builds the demo recipe's synthetic catalog and key frames (download, preprocess and
keyframes stages, reused when the project home already has them), then runs the
perception stage once per mode with the recipe's perceiver (the tiny VLM on a CPU by
default) and prints what each cost. The tiny VLM's replies are noise; the counts are
not: they depend only on the catalog, the key frames and the mode.

    python benchmarks/perception_modes.py                      # a temporary home
    python benchmarks/perception_modes.py --home /tmp/er-home  # keep and reuse the stages
    python benchmarks/perception_modes.py --recipe my.yaml --set perception.backend.base_url=...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def merge(into: dict, more: dict) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="smoke")
    parser.add_argument("--home", help="project home (default: a temporary folder)")
    parser.add_argument("--set", action="append", default=[], help="recipe override section.key=value")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(args.home or tmp).resolve()
        os.environ["EMBODIED_R_HOME"] = str(home)  # tiny models are built under the home
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        from embodied_r.config import load_recipe, parse_override
        from embodied_r.perception.stage import run_perception
        from embodied_r.pipeline import execute, plan

        overrides: dict = {}
        for text in args.set:
            merge(overrides, parse_override(text))
        recipe = load_recipe(args.recipe, overrides or None)
        perception = recipe.perception
        if "question_max_new_tokens" not in perception.model_fields_set:
            # The same reply budget per frame in both modes: a question pass answers for
            # up to max_frames key frames at once.
            budget = perception.max_new_tokens * recipe.keyframes.max_frames
            perception = perception.model_copy(update={"question_max_new_tokens": budget})
        stages = plan(recipe, home)
        for name in ("download", "preprocess", "keyframes"):
            execute(stages[name])
        catalog = Path(stages["perception"].inputs["catalog"])
        keyframes = Path(stages["perception"].inputs["keyframes"])

        results = {}
        for mode in ("per_question", "per_video"):
            cfg = perception.model_copy(update={"mode": mode})
            out = home / "benchmarks" / "perception_modes" / f"{mode}-{stages['perception'].key}"
            start = time.perf_counter()
            summary = run_perception(catalog, keyframes, out, cfg)
            summary["seconds"] = round(time.perf_counter() - start, 1)
            results[mode] = summary

    first = results["per_question"]
    print(f"catalog: {first['questions']} questions, {first['mean_frames']:.2f} key frames per question "
          f"(recipe {args.recipe!r}, perceiver {perception.backend.kind}:{perception.backend.model}, "
          f"reply budget {perception.max_new_tokens} tokens per call, "
          f"{perception.question_max_new_tokens} per question pass)")
    print(f"{'mode':<13} {'calls':>6} {'per question':>13} {'prompt tokens':>14} {'completion tokens':>18} "
          f"{'failed':>7} {'seconds':>8}  calls by kind")
    for mode, s in results.items():
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["calls_by_kind"].items()))
        print(f"{mode:<13} {s['calls']:>6} {s['calls_per_question']:>13.2f} {s['prompt_tokens']:>14,} "
              f"{s['completion_tokens']:>18,} {s['failed']:>7} {s['seconds']:>8}  {kinds}")
    base, video = results["per_question"], results["per_video"]
    if base["calls"] and base["prompt_tokens"]:
        print(f"per_video / per_question: calls x{video['calls'] / base['calls']:.2f}, "
              f"prompt tokens x{video['prompt_tokens'] / base['prompt_tokens']:.2f}, "
              f"completion tokens x{video['completion_tokens'] / max(base['completion_tokens'], 1):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
