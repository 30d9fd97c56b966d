"""An experiment's declaration: its variants, each a set of recipe overrides (or the SFT
baseline on the same records), the baseline they are compared with, what is measured, and
whether the trained models are also evaluated out of distribution.

Declared in YAML, one file per experiment: the packaged ones in ``recipes/experiments/``, or
any file a user writes in the same form (``embodied-r experiment my-ablation.yaml``).
Overrides are written as ``--set`` writes them, dotted keys included
(``training.stages.stage3.rewards.consistency: 0``; see ``config.deep_merge`` for lists).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from embodied_r.config import RECIPES_DIR, Recipe, validated
from embodied_r.merge import deep_merge
from embodied_r.errors import RecipeError
from embodied_r.explain import yaml_words

EXPERIMENTS_DIR = RECIPES_DIR / "experiments"
ACCURACY = "evaluate:accuracy/overall"


def nested(overrides: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys (``a.b.c: 1``) as the nested mapping the recipe loader merges."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = str(key).split(".")
        if not all(parts):
            raise RecipeError(f"override {key!r}: the key must look like section.key")
        node: dict[str, Any] = {}
        cur = node
        for part in parts[:-1]:
            cur = cur.setdefault(part, {})
        cur[parts[-1]] = nested(value) if isinstance(value, dict) else value
        out = deep_merge(out, node)
    return out


class Variant(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str = ""
    # "pipeline": the recipe with ``set`` merged in, run whole. "sft": the SFT baseline
    # trained on the baseline variant's records, from the model its GRPO stages started from,
    # on as many examples as those stages generated completions (``sft_budget``).
    train: Literal["pipeline", "sft"] = "pipeline"
    set: dict[str, Any] = Field(default_factory=dict)

    def overrides(self) -> dict[str, Any]:
        return nested(self.set)


class Measure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # ``stage:key``: the key of that stage's summary.json (``evaluate:accuracy/overall``,
    # ``perception:calls``); the evaluate stage's own figures are read for every variant.
    # ``stage:seconds`` is the wall time of the stage run that computed it, read from MLflow.
    source: str = Field(pattern=r"^[a-z_]+:.+$")
    label: str = ""

    @property
    def stage(self) -> str:
        return self.source.split(":", 1)[0]

    @property
    def key(self) -> str:
        return self.source.split(":", 1)[1]

    @property
    def name(self) -> str:
        return self.label or self.key


class Experiment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    baseline: str
    variants: dict[str, Variant]
    # Beside accuracy (always measured, and the figure the paired test compares).
    measures: list[Measure] = Field(default_factory=list)
    # Recipe settings the experiment cannot run without: dotted path -> why, and the fix.
    requires: dict[str, str] = Field(default_factory=dict)
    # Also evaluate every variant's model on the recipe's out-of-distribution sets
    # (``Recipe.out_of_distribution``); the in-distribution test split is always evaluated.
    out_of_distribution: bool = False

    @model_validator(mode="after")
    def _baseline_is_a_pipeline_variant(self) -> "Experiment":
        if self.baseline not in self.variants:
            raise ValueError(f"baseline {self.baseline!r} is not one of the variants ({', '.join(self.variants)})")
        if self.variants[self.baseline].train != "pipeline":
            raise ValueError(f"baseline {self.baseline!r} must train with the pipeline")
        return self

    def ordered(self) -> list[str]:
        """The baseline first: an SFT variant takes its budget from the baseline's run."""
        return [self.baseline, *(n for n in self.variants if n != self.baseline)]


def available_experiments(folder: Path = EXPERIMENTS_DIR) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_experiment(name_or_path: str | Path, folder: Path = EXPERIMENTS_DIR) -> Experiment:
    path = Path(name_or_path).expanduser()
    if path.suffix not in {".yaml", ".yml"}:
        path = folder / f"{name_or_path}.yaml"
        if not path.is_file():
            raise RecipeError(f"no experiment named {name_or_path!r}; choose one of "
                              f"{', '.join(available_experiments(folder))} or give the path of a YAML file")
    if not path.is_file():
        raise RecipeError(f"experiment file {path} not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(f"experiment {path} is not valid YAML at {yaml_words(exc)}: fix it there") from exc
    if not isinstance(data, dict):
        raise RecipeError(f"experiment {path} must be a mapping with variants and a baseline")
    data.setdefault("name", path.stem)
    return validated(Experiment, data, f"experiment {path}")


def seed_overrides(seed: int, warmstart: bool = True) -> dict[str, Any]:
    """What a seed changes: the trainers' seeds (initial sampling, data order and rollouts),
    not the benchmark's, so every seed learns from the same questions and the variants of
    one seed are compared on the same test questions. The warm start's only where the recipe
    has one (a seed must not add a warm start to a recipe without)."""
    return {"training": {"seed": seed}, **({"warmstart": {"seed": seed}} if warmstart else {})}


def variant_overrides(experiment: Experiment, variant: str, seed: int | None,
                      base: dict[str, Any] | None = None, warmstart: bool = True) -> dict[str, Any]:
    """The overrides a variant's run loads its recipe with: the user's own (``--set``), the
    variant's (an SFT variant trains on the baseline's records, so it takes the baseline's),
    then the seed's. No variant promotes: an ablation's model is not a candidate for the
    registry's champion, and each would otherwise move the alias."""
    chosen = experiment.variants[variant]
    own = experiment.variants[experiment.baseline] if chosen.train == "sft" else chosen
    merged = deep_merge(deep_merge(base or {}, own.overrides()), {"tracking": {"promote": False}})
    return deep_merge(merged, seed_overrides(seed, warmstart)) if seed is not None else merged


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, BaseModel) or part not in type(data).model_fields:
            return None
        data = getattr(data, part)
    return data


def check_requirements(experiment: Experiment, recipe: Recipe) -> None:
    """One line naming each setting the experiment needs and the recipe lacks."""
    missing = [f"{path}: {why}" for path, why in experiment.requires.items() if _lookup(recipe, path) is None]
    if experiment.out_of_distribution and not recipe.out_of_distribution:
        missing.append("out_of_distribution: the recipe names no out-of-distribution evaluation set; add one "
                       "(docs/experiments.md)")
    if missing:
        raise RecipeError(f"experiment {experiment.name} with recipe {recipe.name}: " + "; ".join(missing))


def ood_overrides(recipe: Recipe, name: str, model: str, judge: str | None = None) -> dict[str, Any]:
    """An evaluation-only run of ``model`` on the recipe's out-of-distribution set ``name``:
    the set's overrides (its benchmark or task family), the model given, nothing trained,
    nothing promoted, no baselines; the consistency judge the in-distribution evaluation had
    (``judge``: its model as planned there, a folder where the recipe named the warm start)."""
    evaluation: dict[str, Any] = {"model": model, "compare_baselines": False}
    if recipe.evaluation.consistency_judge is not None and judge:
        evaluation["consistency_judge"] = {"model": judge}
    return deep_merge(nested(recipe.out_of_distribution[name]), {
        "evaluation": evaluation, "tracking": {"promote": False}})
