"""The Embodied-R plan: which stages a recipe has, in run order, each with its own config.

What each stage reads is its kind's declaration (``stage_kinds``); ``stage_plan.PlanBuilder``
turns it into input paths, dependencies and the stage's key, which hashes the stage's config
(less its operational settings, ``embodied_r.settings``), the keys of the stages it reads and
the code it runs. ``plan`` is pure; ``execute`` runs one stage through its runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel

from embodied_r.config import Recipe
from embodied_r.paths import home as default_home
from embodied_r.runners import runner
from embodied_r.settings import result_settings
from embodied_r.stage_kinds import kinds
from embodied_r.tracking.store import tracking_uri
from embodied_r.stage_plan import Input, Plan, PlanBuilder, Ref, StageError, StagePlan

__all__ = ["Plan", "StageError", "StagePlan", "WARMSTART_REF", "execute", "plan", "training_stage_names"]

# training.reference.model naming the warm start's model (frozen) as the consistency reference.
WARMSTART_REF = "warmstart"


def plan(recipe: Recipe, root: Path | None = None) -> Plan:
    """Every stage of the pipeline in run order."""
    builder = PlanBuilder(Path(root) if root else default_home(), model=recipe.training.policy)
    add = builder.add

    add("download", "download", recipe.download.model_dump(mode="json"), keyed=result_settings(recipe.download),
        inputs={"sources_root": str(builder.root / "sources")})
    for kind, section in (("preprocess", recipe.catalog), ("keyframes", recipe.keyframes),
                          ("perception", recipe.perception), ("convert", recipe.records)):
        add(kind, kind, section.model_dump(mode="json"), keyed=result_settings(section))
    evaluation = recipe.evaluation_settings()
    evaluation_cfg, evaluation_keyed = evaluation.model_dump(mode="json"), result_settings(evaluation)
    if recipe.evaluation.model is not None:
        # A given model (the authors' released weights): no warm start, no training.
        add("evaluate", "evaluate", evaluation_cfg, keyed=evaluation_keyed,
            inputs={"model": str(recipe.evaluation.model)})
        return builder.plan("embodied-r", recipe.model_dump(mode="json"))
    # The trainer's interpreter travels as an input, not in the config it validates.
    training = recipe.training.model_dump(mode="json", exclude={"stages", "python"})
    training_keyed = result_settings(recipe.training, exclude={"stages"})
    if recipe.warmstart is not None:
        warm_cfg = recipe.warmstart.model_dump(mode="json", exclude={"python"})
        warm_keyed = result_settings(recipe.warmstart)
        if warm_cfg["max_prompt_length"] is None:
            # Taught on prompts cut as the GRPO stages and evaluation cut them.
            warm_cfg["max_prompt_length"] = warm_keyed["max_prompt_length"] = recipe.training.max_prompt_length
        add("warmstart", "warmstart", warm_cfg, keyed=warm_keyed, inputs={"python": recipe.warmstart.python or ""})
    # The warm-started model, frozen: it was taught the reference's task beside the policy's;
    # as the consistency reference of training and as evaluation's judge of consistency.
    for where, cfg, keyed in (("training.reference", training["reference"], training_keyed["reference"]),
                              ("evaluation.consistency_judge", evaluation_cfg["consistency_judge"],
                               evaluation_keyed["consistency_judge"])):
        if cfg is not None and cfg["model"] == WARMSTART_REF:
            if "warmstart" not in builder.stages:
                raise StageError(f"{where}.model is {WARMSTART_REF!r} but the recipe has no warmstart section")
            cfg["model"] = keyed["model"] = str(Path(builder.stages["warmstart"].out) / "model")
    # Under stage_chain: resume one learning-rate schedule spans every stage: each needs them all.
    chain = ({"chain": [s.model_dump(mode="json") for s in recipe.training.stages]}
             if recipe.training.stage_chain == "resume" else {})
    baselines: dict[str, str | Ref] = {}
    if recipe.evaluation.compare_baselines:
        # The same test questions answered before any training and after the warm start,
        # so the report shows what each phase added.
        baselines["untrained"] = recipe.training.policy
        if "warmstart" in builder.stages:
            baselines["warmstart"] = Ref("warmstart", "model")
    for stage in recipe.training.stages:
        add(f"train_{stage.name}", "train", {"stage": stage.model_dump(mode="json"), "training": training, **chain},
            keyed={"stage": result_settings(stage), "training": training_keyed, **chain},
            inputs={"python": recipe.training.python or ""})
    for label, model in baselines.items():
        add(f"evaluate_{label}", "evaluate", evaluation_cfg, keyed=evaluation_keyed, inputs={"model": model})
    model = builder.model
    final: dict[str, Input] = {"model": Ref(model.stage, recipe.evaluated_checkpoint()) if isinstance(model, Ref)
                               else model}
    if baselines:
        # The learning figures: what each phase added, and each training stage's rewards.
        final["baselines"] = {b: Ref(f"evaluate_{b}") for b in baselines}
        final["training"] = {n: Ref(n) for n, sp in builder.stages.items() if sp.kind == "train"}
    add("evaluate", "evaluate", evaluation_cfg, keyed=evaluation_keyed, inputs=final)
    if recipe.tracking.promote:
        bars = recipe.tracking.model_dump(mode="json", include={"registered_model", "promote_split", "promote_metric"})
        # The registry it promotes in: another store is another promotion.
        store = tracking_uri(recipe.tracking.tracking_uri, builder.root)
        add("promote", "promote", {**bars, "store": store, "evaluation": evaluation_cfg, "recipe": recipe.name,
                                   "experiment": recipe.tracking.experiment},
            keyed={**bars, "store": store, "evaluation": evaluation_keyed}, inputs={"home": str(builder.root)})
    _add_unplaced(recipe, builder)
    return builder.plan("embodied-r", recipe.model_dump(mode="json"))


def _add_unplaced(recipe: Recipe, builder: PlanBuilder) -> None:
    """A kind of the table that the plan above does not place runs last, reading what its
    entry declares, with its recipe section as config when the recipe has one; a section set
    to None is an optional stage the recipe leaves out."""
    placed = {sp.kind for sp in builder.stages.values()}
    for kind in kinds("embodied-r"):
        section = getattr(recipe, kind.name, _NO_SECTION)
        if kind.name in placed or section is None or kind.name == "promote":
            continue
        has_config = isinstance(section, BaseModel)
        config = section.model_dump(mode="json") if has_config else {}
        builder.add(kind.name, kind.name, config, keyed=result_settings(section) if has_config else {})


_NO_SECTION = object()


def training_stage_names(stages: dict[str, StagePlan]) -> list[str]:
    return [n for n, sp in stages.items() if sp.kind == "train"]


def execute(sp: StagePlan, mlflow_run_id: str | None = None) -> dict[str, Any]:
    """Run one stage (a no-op returning its summary when its folder is complete)."""
    return runner(sp.kind)(Path(sp.out), sp.config, sp.inputs, mlflow_run_id)
