"""The ``embodied-r-experiment`` flow: an experiment's variants at each seed as pipeline subflows,
the comparison on the same questions, and one MLflow parent run with a child run per variant and seed."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from prefect import flow

from embodied_r.config import Recipe, load_recipe
from embodied_r.merge import deep_merge
from embodied_r.experiments.compare import (
    IN_DISTRIBUTION,
    Cell,
    chance_of,
    compare,
    comparison_lines,
    measure_figures,
    metrics_of,
    signatures,
    summary_metrics,
    table,
)
from embodied_r.experiments.spec import (
    ACCURACY,
    Experiment,
    check_requirements,
    load_experiment,
    ood_overrides,
    variant_overrides,
)
from embodied_r.io import read_json, read_summary
from embodied_r.scoring.metrics import summary_interval
from embodied_r.stage_plan import Plan
from embodied_r.tracking import names, record
from embodied_r.tracking.runs import Tracker
from embodied_r.tracking.store import check_store, tracking_uri

EXPERIMENT_TAG = "experiment"
CHANCE = "chance"  # a column of every table: what a uniform guess scores on the same questions


def plans(experiment: Experiment, recipe: str, seeds: list[int | None], overrides: dict[str, Any] | None,
          root: Path) -> dict[tuple[str, int | None], tuple[Recipe, Plan]]:
    """Every variant's recipe and plan at every seed, made before anything runs, so a wrong
    override or a missing setting stops the experiment at once, in one line."""
    from embodied_r.pipeline import plan

    out = {}
    warm = has_warmstart(recipe, overrides)
    for seed in seeds:
        for variant in experiment.ordered():
            loaded = load_recipe(recipe, variant_overrides(experiment, variant, seed, overrides, warm) or None)
            check_requirements(experiment, loaded)
            out[(variant, seed)] = (loaded, plan(loaded, root))
    # The store takes the comparison at the end: one that cannot be opened is said now.
    for uri in dict.fromkeys(tracking_uri(r.tracking.tracking_uri, root) for r, _ in out.values()):
        check_store(uri)
    return out


def plans_to_json(planned: dict[tuple[str, int | None], tuple[Recipe, Plan]]) -> list[dict[str, Any]]:
    """The plans as the flow's parameter: made once, where the experiment starts."""
    return [{"variant": v, "seed": s, "plan": stages.to_json()} for (v, s), (_, stages) in planned.items()]


def plans_from_json(given: list[dict[str, Any]]) -> dict[tuple[str, int | None], tuple[Recipe, Plan]]:
    from flows.runner import recipe_of

    out = {}
    for item in given:
        stages = Plan.from_json(item["plan"])
        out[(item["variant"], item["seed"])] = (recipe_of(stages), stages)
    return out


def has_warmstart(recipe: str, overrides: dict[str, Any] | None) -> bool:
    return load_recipe(recipe, overrides or None).warmstart is not None


def completions_of(stages: Plan) -> int:
    """Completions the GRPO stages of a finished run generated: their optimizer steps this
    schedule took, times the completions per step they ran with."""
    from embodied_r.training.config import TrainingConfig
    from embodied_r.training.stage import completions_per_step

    total = 0
    for sp in stages.values():
        if sp.kind != "train":
            continue
        summary = read_summary(Path(sp.out))
        steps = int(summary.get("global_step_end", 0)) - int(summary.get("global_step_offset") or 0)
        cfg = TrainingConfig.model_validate(sp.config["training"])
        total += max(steps, 0) * completions_per_step(cfg)
    return total


def sft_settings(recipe: Recipe, records: int, completions: int) -> Any:
    """The SFT baseline's settings for the same compute as the GRPO stages: as many training
    examples as they generated completions (each example one prompt and its target, each
    completion one prompt and a sampled reply), over as many passes as that takes."""
    from embodied_r.lifecycle.sft_baseline import sft_config_for
    from embodied_r.training.disk import world_size

    base = sft_config_for(recipe)
    per_step = world_size(base) * base.per_device_train_batch_size * base.gradient_accumulation_steps
    steps = max(1, math.ceil(completions / per_step))
    return base.model_copy(update={"max_steps": steps, "epochs": max(1.0, math.ceil(completions / max(records, 1)))})


def _scores(folder: Path) -> dict[str, float]:
    import pyarrow.parquet as pq

    table = pq.read_table(folder / "predictions.parquet", columns=["uid", "score"]).to_pydict()
    return dict(zip(table["uid"], (float(s) for s in table["score"])))


def timed_stages(experiment: Experiment) -> set[str]:
    """The stages a measure asks ``seconds`` of."""
    return {m.stage for m in experiment.measures if m.key == "seconds"}


def stage_seconds(tracker: Tracker | None, timed: set[str], stages: Plan) -> dict[str, float]:
    """Wall seconds of the stage run that computed each timed stage, found in MLflow by the
    stage's key: a stage's summary does not hold its own time, and a stage found done took
    none in this run."""
    if tracker is None:
        return {}
    out = {}
    for name in timed & set(stages):
        run = record.source_run(tracker, stages[name])
        if run is not None and run.info.end_time:
            out[name] = (run.info.end_time - run.info.start_time) / 1000
    return out


def _cell(experiment: Experiment, variant: str, seed: int | None, evaluation: str, folders: dict[str, str],
          run_id: str, extra: dict[str, float] | None = None, seconds: dict[str, float] | None = None) -> Cell:
    summaries = {name: read_summary(Path(out)) for name, out in folders.items() if Path(out, "summary.json").is_file()}
    for name, value in (seconds or {}).items():
        summaries[name] = {"seconds": value, **summaries.get(name, {})}
    final = summaries["evaluate"]
    measures = [(m.name, m.stage, m.key) for m in experiment.measures]
    metrics = Path(folders["evaluate"]) / "metrics.json"
    chance = chance_of(read_json(metrics)) if metrics.is_file() else None
    extra = {**({} if chance is None else {CHANCE: chance}), **(extra or {})}
    return Cell(variant, seed, evaluation, float(final[ACCURACY.split(":", 1)[1]]),
                summary_interval(final, "accuracy/overall"), _scores(Path(folders["evaluate"])),
                {**measure_figures(summaries, measures), **extra}, run_id)


def _run_pipeline(recipe: str, overrides: dict[str, Any], stages: Plan) -> dict[str, Any]:
    from flows.pipeline import embodied_r

    return embodied_r(recipe=recipe, overrides=overrides or None, plan=stages.to_json())


def _variant_pipeline(recipe: str, ov: dict[str, Any], stages: Plan) -> tuple[dict[str, str], str, str, int]:
    """(folders, model, run id, completions) of a variant the pipeline trains."""
    result = _run_pipeline(recipe, ov, stages)
    return (result["stages"], str(stages["evaluate"].inputs["model"]), result.get("mlflow_run_id") or "",
            completions_of(stages))


def _variant_sft(spec: Experiment, label: str, loaded: Recipe, stages: Plan,
                 budget: int) -> tuple[dict[str, str], str, str]:
    """(folders, model, run id) of a variant the SFT baseline trains on ``budget`` examples."""
    from embodied_r.lifecycle.sft_baseline import sft_baseline

    records = read_json(Path(stages["convert"].out) / "summary.json").get("splits", {}).get("train")
    cfg = sft_settings(loaded, int(records or 0) or budget, budget)
    start = str(Path(stages["warmstart"].out) / "model") if "warmstart" in stages else loaded.training.policy
    print(f"experiment {spec.name}: {label}: SFT from {start} on {budget} examples "
          f"({cfg.max_steps} steps), as many as the GRPO stages' completions")
    done = sft_baseline(loaded, stages, cfg, init_model=start)
    # The stages it shares with the baseline (its records' perception among them).
    folders = {**{n: sp.out for n, sp in stages.items() if n != "evaluate"},
               "evaluate": done["stages"]["sft_evaluate"], "sft": done["stages"]["sft"]}
    return folders, str(Path(done["stages"]["sft"]) / "model"), done.get("mlflow_run_id") or ""


def _out_of_distribution(spec: Experiment, recipe: str, root: Path, variant: str, seed: int | None, label: str,
                         loaded: Recipe, stages: Plan, ov: dict[str, Any], model: str,
                         seconds: Any) -> list[Cell]:
    """One cell per out-of-distribution set of the recipe, each a pipeline run evaluating ``model``."""
    cells = []
    for ood in loaded.out_of_distribution:
        judge = (stages["evaluate"].config.get("consistency_judge") or {}).get("model")
        ood_ov = deep_merge(ov, ood_overrides(loaded, ood, model, judge))
        print(f"experiment {spec.name}: {label} on {ood} (out of distribution)")
        ood_stages = _plan(recipe, ood_ov, root)
        result = _run_pipeline(recipe, ood_ov, ood_stages)
        cells.append(_cell(spec, variant, seed, ood, result["stages"], result.get("mlflow_run_id") or "",
                           seconds=seconds(ood_stages)))
    return cells


def _report(spec: Experiment, base: Recipe, runs: list[int | None], cells: list[Cell],
            comparisons: list) -> list[str]:
    """The experiment's table, its comparisons and the failure signatures they show."""
    measures = [CHANCE] + [m.name for m in spec.measures] + (["completions"] if any(
        v.train == "sft" for v in spec.variants.values()) else [])
    head = (f"Experiment {spec.name}, recipe {base.name}, "
            f"seeds {', '.join(str(s) for s in runs)}:")
    lines = [head, *table(cells, measures), "",
             *comparison_lines(comparisons, spec.baseline)]
    if found := signatures(cells, comparisons):
        lines += ["", *found]
    return lines


def _as_json(cells: list[Cell], comparisons: list) -> dict[str, Any]:
    return {"cells": [{"variant": c.variant, "seed": c.seed, "evaluation": c.evaluation, "accuracy": c.accuracy,
                       "interval": c.interval, "figures": c.figures, "run_id": c.run_id} for c in cells],
            "comparisons": [{"variant": c.variant, "evaluation": c.evaluation,
                             "pooled": c.pooled.figures("pooled"),
                             "by_seed": {str(s): r.figures("paired") for s, r in c.by_seed.items()}}
                            for c in comparisons]}


@flow(name="embodied-r-experiment", log_prints=True)
def experiment(name: str, recipe: str = "demo", seeds: list[int] | None = None,
               overrides: dict[str, Any] | None = None, home: str | None = None,
               planned: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run experiment ``name`` (a packaged experiment or a YAML path) with ``recipe`` at each of
    ``seeds`` (None: the recipe's own seed) and compare its variants with the baseline.
    ``planned`` (``plans_to_json``) hands down the plans the caller made; without it, as a
    deployment run starts, they are made here."""
    from embodied_r import paths

    spec = load_experiment(name)
    root = paths.claim_home(Path(home).expanduser().resolve() if home else paths.home())
    runs = [None] if not seeds else list(dict.fromkeys(seeds))
    planned = plans_from_json(planned) if planned else plans(spec, recipe, runs, overrides, root)
    warm = has_warmstart(recipe, overrides)
    timed = timed_stages(spec)
    base = planned[(spec.baseline, runs[0])][0]
    # One store for every variant's stage times, opened only when a measure asks for them.
    clock = Tracker.open(base.tracking.experiment, tracking_uri(base.tracking.tracking_uri, root), root) \
        if timed else None

    def seconds(stages: Plan) -> dict[str, float]:
        return stage_seconds(clock, timed, stages)

    cells: list[Cell] = []
    started: dict[tuple[str, int | None], dict[str, Any]] = {}
    for seed in runs:
        budget = None
        for variant in spec.ordered():
            loaded, stages = planned[(variant, seed)]
            ov = variant_overrides(spec, variant, seed, overrides, warm)
            label = f"{variant} (seed {seed})" if seed is not None else variant
            if spec.variants[variant].train == "pipeline":
                print(f"experiment {spec.name}: {label}")
                folders, model, run_id, completions = _variant_pipeline(recipe, ov, stages)
                if variant == spec.baseline:
                    budget = completions
                extra = {"completions": float(completions)}
            else:
                assert budget is not None  # the baseline runs first (Experiment.ordered)
                folders, model, run_id = _variant_sft(spec, label, loaded, stages, budget)
                extra = {"completions": float(budget)}
            cells.append(_cell(spec, variant, seed, IN_DISTRIBUTION, folders, run_id, extra, seconds(stages)))
            started[(variant, seed)] = {"run_id": run_id, "overrides": ov, "model": model}
            if spec.out_of_distribution:
                cells += _out_of_distribution(spec, recipe, root, variant, seed, label, loaded, stages, ov, model,
                                              seconds)
    comparisons = compare(cells, spec.baseline)
    lines = _report(spec, base, runs, cells, comparisons)
    logged = _track(spec, base, root, runs, cells, comparisons, started, lines)
    return {"lines": lines, **logged, **_as_json(cells, comparisons)}


def _plan(recipe: str, overrides: dict[str, Any], root: Path) -> Plan:
    from embodied_r.pipeline import plan

    return plan(load_recipe(recipe, overrides or None), root)


def _track(spec: Experiment, recipe: Recipe, root: Path, seeds: list[int | None], cells: list[Cell],
           comparisons: list, started: dict, lines: list[str]) -> dict[str, Any]:
    """The experiment's parent run (its table as ``experiment.txt``, the means and pooled tests
    as metrics) and one child run per variant and seed, each with its figures on every
    evaluation set and a link to the run that trained it."""
    uri = tracking_uri(recipe.tracking.tracking_uri, root)
    tracker = Tracker.open(recipe.tracking.experiment, uri, root).start_parent(
        name=f"{recipe.name}-experiment-{spec.name}",
        tags={EXPERIMENT_TAG: spec.name, "recipe": recipe.name, "baseline": spec.baseline,
              "seeds": ",".join(str(s) for s in seeds)},
        params={"experiment": spec.name, "baseline": spec.baseline, "variants": ",".join(spec.variants),
                "seeds": ",".join(str(s) for s in seeds)})
    parent = tracker.parent_run_id or ""
    children = []
    by_variant = {(c.variant, c.evaluation): c for c in comparisons}
    for (variant, seed), info in started.items():
        run_id = tracker.start_stage(f"{variant} seed {seed}" if seed is not None else variant,
                                     {"variant": variant, "seed": seed, "overrides": json.dumps(info["overrides"]),
                                      "train": spec.variants[variant].train},
                                     tags={EXPERIMENT_TAG: spec.name, "variant": variant, "seed": str(seed),
                                           "trained_by_run": info["run_id"], "model": info["model"]})
        metrics: dict[str, float] = {}
        for cell in cells:
            if cell.variant == variant and cell.seed == seed:
                metrics.update(metrics_of(cell, by_variant.get((variant, cell.evaluation))))
        tracker.log_metrics(run_id, metrics)
        tracker.finish(run_id)
        children.append(run_id)
    tracker.log_metrics(parent, summary_metrics(cells, comparisons))
    table_file = root / "experiments" / f"{spec.name}-{parent[:8]}.txt"
    table_file.parent.mkdir(parents=True, exist_ok=True)
    table_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    declared = table_file.with_suffix(".json")
    declared.write_text(json.dumps(spec.model_dump(mode="json"), indent=1), encoding="utf-8")
    tracker.log_artifacts(parent, [table_file, declared])
    tracker.finish(parent)
    return {"mlflow_run_id": parent, "tracking_uri": uri, "children": children, "table_file": str(table_file),
            "mlflow_run_url": names.run_url(uri, tracker.experiment_id, parent),
            "mlflow_compare_url": names.compare_url(uri, tracker.experiment_id, children)}
