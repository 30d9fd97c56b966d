"""An experiment's declaration, one YAML file each (``recipes/experiments/`` or a user's): its
variants as recipe overrides written as ``--set`` writes them (dotted keys included), the
baseline they are compared with, what is measured, and its seeds' and variants' overrides."""

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
    """Dotted keys (``a.b.c: 1``) nested."""
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
    # "sft": the SFT baseline on the baseline variant's records, from the model its GRPO stages
    # started from, on as many examples as those stages generated completions.
    train: Literal["pipeline", "sft"] = "pipeline"
    set: dict[str, Any] = Field(default_factory=dict)

    def overrides(self) -> dict[str, Any]:
        return nested(self.set)


class Measure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # ``stage:key`` of that stage's summary.json; ``stage:seconds``: the wall time of the stage
    # run that computed it, read from MLflow.
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
    measures: list[Measure] = Field(default_factory=list)
    # dotted path -> why, and the fix
    requires: dict[str, str] = Field(default_factory=dict)
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
    """The trainers' seeds, not the benchmark's: every seed learns from the same questions and a
    seed's variants are compared on the same test questions. A seed must not add a warm start."""
    return {"training": {"seed": seed}, **({"warmstart": {"seed": seed}} if warmstart else {})}


def variant_overrides(experiment: Experiment, variant: str, seed: int | None,
                      base: dict[str, Any] | None = None, warmstart: bool = True) -> dict[str, Any]:
    """The user's ``--set``, the variant's (an SFT variant takes the baseline's: it trains on its
    records), then the seed's. No variant promotes: an ablation's model is no champion candidate."""
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
    missing = [f"{path}: {why}" for path, why in experiment.requires.items() if _lookup(recipe, path) is None]
    if experiment.out_of_distribution and not recipe.out_of_distribution:
        missing.append("out_of_distribution: the recipe names no out-of-distribution evaluation set; add one "
                       "(docs/experiments.md)")
    if missing:
        raise RecipeError(f"experiment {experiment.name} with recipe {recipe.name}: " + "; ".join(missing))


def ood_overrides(recipe: Recipe, name: str, model: str, judge: str | None = None) -> dict[str, Any]:
    """An evaluation-only run of ``model`` on the out-of-distribution set ``name``, judged as the
    in-distribution evaluation was (``judge``: its planned model)."""
    evaluation: dict[str, Any] = {"model": model, "compare_baselines": False}
    if recipe.evaluation.consistency_judge is not None and judge:
        evaluation["consistency_judge"] = {"model": judge}
    return deep_merge(nested(recipe.out_of_distribution[name]), {
        "evaluation": evaluation, "tracking": {"promote": False}})
