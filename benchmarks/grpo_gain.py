"""Does GRPO add to the warm start, run after run? The figures of finished demo runs, per run and pooled.

Reads the stage folders of finished runs (``embodied-r demo --seed N`` or an experiment's
variants, located by planning the recipe with the same overrides) and prints, per run:
- test accuracy of the warm-started and the GRPO-trained policy, and their paired test;
- per GRPO stage: the sampled accuracy reward in the first and last quarter of its steps, the
  share of groups whose completions all scored alike (no gradient), the mean within-group
  reward spread, the KL term, and (``--per-stage``) greedy val and test accuracy after the stage;
then, over all runs: the mean paired gain, the pooled paired test (every run's questions as pairs
of one McNemar test), the runs with a significant loss, and the runs where the accuracy reward
rose within at least one stage.

    python benchmarks/grpo_gain.py --home ~/.embodied-r --seeds 42 1 2
    python benchmarks/grpo_gain.py --home avx2=/tmp/a --home default=/tmp/b --seeds 42 1 2 3 4 \\
        --set training.learning_rate=1e-4 --per-stage --json gain.json
    python benchmarks/grpo_gain.py --home a=/tmp/a@42,1,2 --home b=/tmp/b@3,4   # seeds per home
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

STAGES = ("train_stage1", "train_stage2", "train_stage3")


def _read(folder: Path, name: str) -> Any:
    return json.loads((folder / name).read_text())


def _scores(folder: Path) -> dict[str, float]:
    import pyarrow.parquet as pq

    rows = pq.read_table(folder / "predictions.parquet", columns=["uid", "score"]).to_pylist()
    return {r["uid"]: float(r["score"] or 0.0) for r in rows}


def stage_figures(folder: Path, summary: dict[str, Any], stage: str) -> dict[str, Any]:
    """One GRPO stage summed up: its first and last quarters as the evaluation's learning figures
    already give them, and the means over its steps of what they do not (spread, KL)."""
    history = [e for e in _read(folder, "history.json")["history"] if "train_runtime" not in e]
    series = lambda key: [float(e[key]) for e in history if isinstance(e.get(key), (int, float))]  # noqa: E731
    mean = lambda key: sum(series(key)) / max(len(series(key)), 1)  # noqa: E731
    quarters = lambda name: tuple(summary[f"learning/{stage}/{name}/{q}_quarter"] for q in ("first", "last"))  # noqa: E731
    return {"accuracy_reward": quarters("accuracy_reward"), "zero_std_groups": quarters("zero_std_groups"),
            "entropy": quarters("entropy"), "reward_std": mean("reward_std"), "kl": mean("kl"), "steps": len(history)}


def greedy(model: str, split: str, recipe: Any, stages: Any) -> float:
    """Greedy accuracy of a model folder on a split, as every evaluation of the reasoner asks it
    (judge off: only the accuracy is wanted); cached in the home's evaluations/ by the model."""
    from embodied_r.lifecycle.models import converted_records, store_of
    from embodied_r.evaluation.models import evaluate_model

    cfg = recipe.evaluation_settings().model_copy(update={"consistency_judge": None})
    _, summary = evaluate_model(model, split, records=converted_records(stages), cfg=cfg, root=stages.root,
                                store=store_of(recipe, stages))
    return float(summary["accuracy/overall"])


def run_figures(label: str, home: Path, seed: int, overrides: dict[str, Any], per_stage: bool) -> dict[str, Any] | None:
    from embodied_r.config import load_recipe, raw_recipe
    from embodied_r.experiments.spec import seed_overrides
    from embodied_r.merge import deep_merge
    from embodied_r.pipeline import plan

    warm = raw_recipe("demo", overrides or None).get("warmstart") is not None
    recipe = load_recipe("demo", deep_merge(overrides, seed_overrides(seed, warm)))
    stages = plan(recipe, home)
    needed = ("evaluate", "evaluate_warmstart", *STAGES)
    if not all(stages[n].complete for n in needed):
        print(f"{label} seed {seed}: not finished in {home} (run `embodied-r demo --seed {seed}` there)",
              file=sys.stderr)
        return None
    evaluate = Path(stages["evaluate"].out)
    summary = _read(evaluate, "summary.json")
    out: dict[str, Any] = {
        "label": label, "seed": seed,
        "untrained": summary.get("learning/accuracy/untrained"),
        "warm": summary["learning/accuracy/warmstart"], "trained": summary["learning/accuracy/trained"],
        "paired": {k: summary[f"learning/paired/{k}"] for k in ("difference", "ci_low", "ci_high", "p_value",
                                                                 "better", "worse", "n")},
        "scores": {"warm": _scores(Path(stages["evaluate_warmstart"].out)), "trained": _scores(evaluate)},
        "stages": {n: stage_figures(Path(stages[n].out), summary, n.removeprefix("train_")) for n in STAGES},
    }
    if per_stage:
        models = {"warmstart": str(Path(stages["warmstart"].out) / "model"),
                  **{n: str(Path(stages[n].out) / "model") for n in STAGES}}
        out["greedy"] = {n: {s: greedy(m, s, recipe, stages) for s in ("val", "test")} for n, m in models.items()}
    return out


def pooled(runs: list[dict[str, Any]]) -> Any:
    from embodied_r.scoring.paired import paired_test

    a: list[float] = []
    b: list[float] = []
    for r in runs:
        both = [u for u in r["scores"]["warm"] if u in r["scores"]["trained"]]
        a += [r["scores"]["warm"][u] for u in both]
        b += [r["scores"]["trained"][u] for u in both]
    return paired_test(a, b)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def report(runs: list[dict[str, Any]]) -> str:
    from embodied_r.scoring.paired import ALPHA, format_p, format_paired

    lines = ["| run | seed | warm -> GRPO (test) | paired: points, p (better/worse) | accuracy reward, first -> last "
             "quarter, stage 1 / 2 / 3 | groups all alike (last quarter) | reward spread | KL |",
             "|" + "---|" * 8]
    for r in runs:
        p = r["paired"]
        st = [r["stages"][n] for n in STAGES]
        lines.append(
            f"| {r['label']} | {r['seed']} | {_pct(r['warm'])} -> {_pct(r['trained'])} | "
            f"{100 * p['difference']:+.1f}, {format_p(p['p_value'])} ({p['better']:.0f}/{p['worse']:.0f}) | "
            + " / ".join(f"{_pct(s['accuracy_reward'][0])} -> {_pct(s['accuracy_reward'][1])}" for s in st) + " | "
            + " / ".join(_pct(s["zero_std_groups"][1]) for s in st) + " | "
            + " / ".join(f"{s['reward_std']:.2f}" for s in st) + " | "
            + " / ".join(f"{s['kl']:.3f}" for s in st) + " |")
    if any("greedy" in r for r in runs):
        lines += ["", "| run | seed | greedy val / test after: warm start | stage 1 | stage 2 | stage 3 |", "|---|---|---|---|---|---|"]
        for r in runs:
            if "greedy" in r:
                g = r["greedy"]
                lines.append(f"| {r['label']} | {r['seed']} | "
                             + " | ".join(f"{_pct(g[n]['val'])} / {_pct(g[n]['test'])}" for n in ("warmstart", *STAGES))
                             + " |")
    gains = [r["paired"]["difference"] for r in runs]
    losses = [r for r in runs if r["paired"]["difference"] < 0 and r["paired"]["p_value"] < ALPHA]
    rose = [r for r in runs if any(s["accuracy_reward"][1] > s["accuracy_reward"][0] for s in r["stages"].values())]
    lines += ["", f"Runs: {len(runs)}. Mean paired gain {100 * sum(gains) / len(gains):+.1f} points "
              f"(range {100 * min(gains):+.1f} to {100 * max(gains):+.1f}); pooled {format_paired(pooled(runs))}.",
              f"Significant losses (paired p < {ALPHA}): {len(losses)}"
              + (f" ({', '.join(str(r['label']) + ' ' + str(r['seed']) for r in losses)})" if losses else "")
              + f". Accuracy reward rising within at least one stage: {len(rose)} of {len(runs)}."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", action="append", required=True,
                        help="a project home, or LABEL=HOME; HOME@42,1 reads only those seeds there")
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 2, 3, 4])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="the overrides the runs were made with (as embodied-r takes them)")
    parser.add_argument("--per-stage", action="store_true",
                        help="also greedy val and test accuracy after the warm start and each stage")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    from embodied_r.config import parse_overrides

    overrides = parse_overrides(args.set)
    runs = []
    for entry in args.home:
        label, _, path = entry.rpartition("=")
        path, at, only = path.partition("@")
        home = Path(path).expanduser().resolve()
        os.environ["EMBODIED_R_HOME"] = str(home)
        for seed in ([int(s) for s in only.split(",")] if at else args.seeds):
            found = run_figures(label or home.name, home, seed, overrides, args.per_stage)
            if found is not None:
                runs.append(found)
    if not runs:
        return 1
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "scores"} for r in runs], indent=1))
    print(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
