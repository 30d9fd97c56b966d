"""Does the Embodied-Reasoner demo's tiny VLM learn from its SFT data, and how fast?

Runs outside Prefect and MLflow, in one process: the synthetic sample, the three SFT stages
as the pipeline's trainer child runs them (``training.sft_child.main`` on the hook
``interactive.sft_data.conversations``: same collator,
labels and trainer arguments; stage 2 on the catalog's stage-2 trajectories, without
rejection sampling), and the evaluation stage after each SFT stage. Prints per stage its
token accuracy and loss (first -> last quarter of its steps), the highest learning rate it
reached and its seconds, then success and completeness on the test tasks beside the scripted
ceiling (the expert's replies replayed) and the free point (a policy that ends at once).

    python benchmarks/reasoner_learnability.py                       # the recipe's settings, seed 42
    python benchmarks/reasoner_learnability.py --seed 1 --stages imitation --eval last
    python benchmarks/reasoner_learnability.py --steps 1500 --lr 1e-3 --set sft.max_pixels=12544

``--set`` takes the reasoner recipe's keys (as ``embodied-r reasoner --set``); ``--steps``
and ``--lr`` set every stage's (``sft_stages`` in the recipe still win for their stage), and
``--seed`` what ``embodied-r reasoner --seed`` does. torch runs on the recipe's ``torch_threads``: the demo's one thread is
several times faster than two on cores shared with other work.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from embodied_r.config import parse_overrides
from embodied_r.merge import deep_merge
from embodied_r.interactive.catalog import build, read_test_cases, read_trajectories  # noqa: E402
from embodied_r.interactive.config import SFT_STAGES  # noqa: E402
from embodied_r.config import load_reasoner as load  # noqa: E402
from embodied_r.interactive.reference import references  # noqa: E402
from embodied_r.interactive.synthetic import write_dataset  # noqa: E402

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="reasoner-demo")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, help="max_steps of every SFT stage")
    parser.add_argument("--lr", type=float, help="learning rate of every SFT stage")
    parser.add_argument("--seed", type=int, default=None, help="the trainers' seed (the data stay the same)")
    parser.add_argument("--stages", default=",".join(SFT_STAGES), help="SFT stages to run, in order")
    parser.add_argument("--eval", choices=["each", "last"], default="each",
                        help="evaluate after each stage or after the last")
    parser.add_argument("--work", help="work folder (default a temporary one)")
    args = parser.parse_args()

    from embodied_r.training.sft_child import main as train
    from embodied_r.interactive.stages import run_evaluate_stage

    from embodied_r.apps.cli_reasoner import seed_overrides

    overrides = parse_overrides(args.set)
    if args.seed is not None:
        overrides = deep_merge(overrides, seed_overrides(args.seed))  # as ``embodied-r reasoner --seed``
    sft = {k: v for k, v in (("max_steps", args.steps), ("learning_rate", args.lr)) if v is not None}
    recipe = load(args.recipe, deep_merge(overrides, {"sft": sft}) if sft else overrides)
    work = Path(args.work or tempfile.mkdtemp(prefix="reasoner-learnability-"))
    started = time.monotonic()
    raw = work / "data" / "raw"
    write_dataset(raw, recipe.data.synthetic_train, recipe.data.synthetic_test, recipe.data.seed)
    catalog = work / "data"
    build(raw, catalog)
    cases = read_test_cases(catalog)[: recipe.evaluate.limit or None]
    episode = recipe.evaluate.episode
    found = references(cases, work / "reference", episode)
    ceiling, free = found["ceiling"], found["free"]
    print(f"data: {len(read_trajectories(catalog, 1))}/{len(read_trajectories(catalog, 2))}/"
          f"{len(read_trajectories(catalog, 3))} trajectories, {len(cases)} test tasks "
          f"({time.monotonic() - started:.1f} s)")
    print(f"scripted ceiling: success {100 * ceiling['success']:.1f} %, completeness "
          f"{100 * ceiling['completeness']:.1f} %;"
          f" free point (end at once): success {100 * free['success']:.1f} %, completeness "
          f"{100 * free['completeness']:.1f} %", flush=True)

    from embodied_r.backends.models import resolve_model

    model = resolve_model(recipe.base_model)
    rows = []
    for i, stage in enumerate(args.stages.split(","), start=1):
        number = SFT_STAGES.index(stage) + 1
        cfg = deep_merge(recipe.sft.model_dump(mode="json"), recipe.sft_stages.get(stage, {}))
        out = work / f"sft_{stage}"
        out.mkdir(parents=True, exist_ok=True)
        data = read_trajectories(catalog, number)
        (out / "data.json").write_text(json.dumps(data))
        spec = {"examples": "embodied_r.interactive.sft_data:conversations", "init_model": model, "work": str(out),
                "data": str(out / "data.json"), "sft": cfg, "stage": f"reasoner_sft_{stage}",
                "torch_threads": recipe.torch_threads}
        (out / "spec.json").write_text(json.dumps(spec))
        t0 = time.monotonic()
        train(str(out / "spec.json"))
        result = json.loads((out / "train_result.json").read_text())
        model = str(out / "model")
        row = {"stage": stage, "steps": result["steps"], "seconds": round(time.monotonic() - t0, 1),
               "conversations": result["train_records"], "token_accuracy": result["token_accuracy"],
               "loss": result["loss"], "peak_lr": result["peak_learning_rate"]}
        if args.eval == "each" or i == len(args.stages.split(",")):
            t0 = time.monotonic()
            summary = run_evaluate_stage(work / f"eval_{stage}", {"evaluate": recipe.evaluate.model_dump(mode="json"),
                                                                  "backend": recipe.backend.model_dump(mode="json"),
                                                                  "torch_threads": recipe.torch_threads},
                                         {"catalog": str(catalog), "model": model})
            m = summary["metrics"]
            row.update(success=m["success/all"], completeness=m["completeness/all"],
                       eval_seconds=round(time.monotonic() - t0, 1), stops=summary["stops"])
        rows.append(row)
        acc, loss = row["token_accuracy"], row["loss"]
        line = f"SFT {stage:11s} {row['steps']:4d} steps {row['seconds']:6.1f} s  "
        if acc["first"] is None:  # fewer steps than logging_steps
            line += "no step logged"
        else:
            line += (f"token accuracy {acc['first']:.3f} -> {acc['last']:.3f}  loss {loss['first']:.2f} -> "
                     f"{loss['last']:.2f}  peak lr {row['peak_lr']:.2g}")
        if "success" in row:
            line += (f"  | success {100 * row['success']:5.1f} %  completeness {100 * row['completeness']:5.1f} %"
                     f"  ({row['eval_seconds']} s, stops {row['stops']})")
        print(line, flush=True)
    print(f"total {time.monotonic() - started:.1f} s; work folder {work}")
    (work / "learnability.json").write_text(json.dumps({"ceiling": ceiling, "free": free, "stages": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
