"""The Embodied-R stage graph: what each stage reads, where it writes, and its cache key.

A stage's key (``stage_plan.stage_key``) hashes its own config, the keys of the stages it
reads and the source of the library modules it runs (``runners.code_version``), so editing a
stage's config or code recomputes that stage and everything after it, and nothing before. The config it hashes
leaves out the operational settings (``embodied_r.settings``: timeouts, retries, servers,
workers, failure limits), which change how a result is obtained, never the result. ``plan`` is pure;
``execute`` runs one stage through its registered runner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from embodied_r.config import Recipe
from embodied_r.paths import home as default_home
from embodied_r.runners import extra_key, runner
from embodied_r.settings import result_settings
from embodied_r.stage_kinds import kinds
from embodied_r.stage_plan import PlanBuilder, StagePlan, downstream as _downstream

__all__ = ["StageError", "StagePlan", "WARMSTART_REF", "downstream", "execute", "plan", "resolve_stage_name",
           "select_stages", "training_stage_names"]

# training.reference.model naming the warm start's model (frozen) as the consistency reference.
WARMSTART_REF = "warmstart"


class StageError(ValueError):
    """An unknown stage, or a stage asked for before the stages it reads from."""


def plan(recipe: Recipe, root: Path | None = None) -> dict[str, StagePlan]:
    """Every stage of the pipeline in run order."""
    builder = PlanBuilder(Path(root) if root else default_home())
    stages, add, root = builder.stages, builder.add, builder.root

    download = recipe.download.model_dump(mode="json")
    dl = add("download", "download", [], download, {"sources_root": str(root / "sources")},
             extra=extra_key("download", download), keyed=result_settings(recipe.download))
    cat = add("preprocess", "preprocess", ["download"], recipe.catalog.model_dump(mode="json"),
              {"raw": dl.out}, keyed=result_settings(recipe.catalog))
    catalog_file = str(Path(cat.out) / "catalog.parquet")
    kf = add("keyframes", "keyframes", ["preprocess"], recipe.keyframes.model_dump(mode="json"),
             {"catalog": catalog_file}, keyed=result_settings(recipe.keyframes))
    per = add("perception", "perception", ["preprocess", "keyframes"],
              recipe.perception.model_dump(mode="json"), {"catalog": catalog_file, "keyframes": kf.out},
              keyed=result_settings(recipe.perception))
    conv = add("convert", "convert", ["preprocess", "perception"], recipe.records.model_dump(mode="json"),
               {"catalog": catalog_file, "perception": per.out}, keyed=result_settings(recipe.records))
    evaluation, evaluation_keyed = _evaluation_config(recipe)
    if recipe.evaluation.model is not None:
        # A given model (the authors' released weights): no warm start, no training.
        add("evaluate", "evaluate", ["convert"], evaluation,
            {"records": conv.out, "model": str(recipe.evaluation.model)}, keyed=evaluation_keyed)
        return stages
    # The trainer's interpreter travels as an input, not in the config it validates.
    training = recipe.training.model_dump(mode="json", exclude={"stages", "python"})
    training_keyed = result_settings(recipe.training, exclude={"stages"})
    model = recipe.training.policy
    prev: list[str] = []
    warm = None
    if recipe.warmstart is not None:
        warm_cfg = recipe.warmstart.model_dump(mode="json", exclude={"python"})
        warm_keyed = result_settings(recipe.warmstart)
        if warm_cfg["max_prompt_length"] is None:
            # Taught on prompts cut as the GRPO stages and evaluation cut them.
            warm_cfg["max_prompt_length"] = warm_keyed["max_prompt_length"] = recipe.training.max_prompt_length
        warm = add("warmstart", "warmstart", ["convert"], warm_cfg,
                   {"records": conv.out, "init_model": model, "python": recipe.warmstart.python or ""},
                   keyed=warm_keyed)
        model = str(Path(warm.out) / "model")
        prev = [warm.name]
    if training["reference"]["model"] == WARMSTART_REF:
        if warm is None:
            raise StageError(f"training.reference.model is {WARMSTART_REF!r} but the recipe has no warmstart section")
        # The warm-started model, frozen: it was taught the reference's task beside the policy's.
        training["reference"]["model"] = training_keyed["reference"]["model"] = model
    # Under stage_chain: resume one learning-rate schedule spans every stage: each needs them all.
    chain = ({"chain": [s.model_dump(mode="json") for s in recipe.training.stages]}
             if recipe.training.stage_chain == "resume" else {})
    for stage in recipe.training.stages:
        stage_cfg = stage.model_dump(mode="json")
        sp = add(f"train_{stage.name}", "train", ["convert", *prev],
                 {"stage": stage_cfg, "training": training, **chain},
                 {"records": conv.out, "init_model": model, "python": recipe.training.python or ""},
                 keyed={"stage": result_settings(stage), "training": training_keyed, **chain})
        model = str(Path(sp.out) / "model")
        prev = [sp.name]
    model = recipe.evaluated_model(model)
    baselines: dict[str, str] = {}
    if recipe.evaluation.compare_baselines:
        # The same test questions answered before any training and after the warm start,
        # so the report shows what each phase added.
        before = {"untrained": ([], recipe.training.policy)}
        if warm is not None:
            before["warmstart"] = ([warm.name], str(Path(warm.out) / "model"))
        for label, (deps, ref) in before.items():
            baselines[label] = add(f"evaluate_{label}", "evaluate", ["convert", *deps], evaluation,
                                   {"records": conv.out, "model": ref}, keyed=evaluation_keyed).out
    train_outs = {n: stages[n].out for n in stages if stages[n].kind == "train"}
    add("evaluate", "evaluate", ["convert", *prev, *(f"evaluate_{b}" for b in baselines)], evaluation,
        {"records": conv.out, "model": model,
         **({"baselines": json.dumps(baselines), "training": json.dumps(train_outs)} if baselines else {})},
        keyed=evaluation_keyed)
    _add_unplaced(recipe, builder)
    return stages


def _evaluation_config(recipe: Recipe) -> tuple[dict[str, Any], dict[str, Any]]:
    """The evaluate stages' config, and the part of it that keys them."""
    settings = recipe.evaluation_settings()
    return settings.model_dump(mode="json"), result_settings(settings)


def _add_unplaced(recipe: Recipe, builder: PlanBuilder) -> None:
    """A kind of the table that the graph above does not place runs after the stages of the
    kinds it reads, given their folders by stage name and its recipe section when the recipe
    has one; a section set to None is an optional stage the recipe leaves out (warmstart)."""
    placed = {sp.kind for sp in builder.stages.values()}
    for kind in kinds("embodied-r"):
        section = getattr(recipe, kind.name, _NO_SECTION)
        if kind.name in placed or section is None:
            continue
        deps = [name for name, sp in builder.stages.items() if sp.kind in kind.reads]
        has_config = isinstance(section, BaseModel)
        config = section.model_dump(mode="json") if has_config else {}
        builder.add(kind.name, kind.name, deps, config, {d: builder.stages[d].out for d in deps},
                    keyed=result_settings(section) if has_config else {}, extra=extra_key(kind.name, config))


_NO_SECTION = object()


def downstream(stages: dict[str, StagePlan], name: str) -> list[str]:
    """``name`` and every stage that reads from it, directly or not, in run order."""
    if name not in stages:
        raise StageError(f"unknown stage {name!r}; stages are {', '.join(stages)}")
    return _downstream(stages, [name])


def resolve_stage_name(stages: dict[str, StagePlan], name: str) -> str:
    """Accept a stage's name or its kind ("train" means the first training stage)."""
    if name in stages:
        return name
    for sp in stages.values():
        if sp.kind == name:
            return sp.name
    raise StageError(f"unknown stage {name!r}; stages are {', '.join(stages)}")


def select_stages(stages: dict[str, StagePlan], only: list[str] | None, recipe_name: str) -> list[str]:
    """The stages to run, checking that each one's inputs exist or are run too."""
    selected = [resolve_stage_name(stages, s) for s in only] if only else list(stages)
    for name in selected:
        missing = [d for d in stages[name].deps if d not in selected and not stages[d].complete]
        if missing:
            raise StageError(
                f"stage {name!r} reads the output of {', '.join(missing)}, which has not been run "
                f"with this recipe: run `embodied-r {stages[missing[0]].kind} --recipe {recipe_name}` "
                f"first, or the whole pipeline with `embodied-r run --recipe {recipe_name}`"
            )
    return selected


def training_stage_names(stages: dict[str, StagePlan]) -> list[str]:
    return [n for n, sp in stages.items() if sp.kind == "train"]


def execute(sp: StagePlan, mlflow_run_id: str | None = None) -> dict[str, Any]:
    """Run one stage (a no-op returning its summary when its folder is complete)."""
    return runner(sp.kind)(Path(sp.out), sp.config, sp.inputs, mlflow_run_id)
