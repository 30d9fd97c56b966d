"""Typed recipes: one YAML file configures every stage.

Recipes ship inside the package (``embodied_r/recipes/*.yaml``); a recipe may
``extends: <name>`` another and override only what differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from embodied_r.data.catalog import CatalogConfig
from embodied_r.data.download import DownloadConfig
from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.keyframes.extract import KeyframeConfig
from embodied_r.perception.stage import PerceptionConfig
from embodied_r.training.records import RecordsConfig, for_policy
from embodied_r.training.config import SFTConfig
from embodied_r.training.config import TrainingConfig

RECIPES_DIR = Path(__file__).parent / "recipes"


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    experiment: str = "embodied-r"
    # None: $MLFLOW_TRACKING_URI, else a SQLite store under the project home.
    tracking_uri: str | None = None
    registered_model: str = "embodied-r-reasoner"
    # After evaluation, register the trained reasoner (once per model) and give it the
    # champion alias when it beats the current champion on ``promote_split``.
    promote: bool = False
    promote_split: str = "val"
    promote_metric: str = "accuracy/overall"


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    download: DownloadConfig = Field(default_factory=DownloadConfig)
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    keyframes: KeyframeConfig = Field(default_factory=KeyframeConfig)
    perception: PerceptionConfig = Field(default_factory=PerceptionConfig)
    records: RecordsConfig = Field(default_factory=RecordsConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    # The SFT baseline (`embodied-r sft`); None takes the training environment and step cap.
    sft: SFTConfig | None = None
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _records_for_policy(self) -> "Recipe":
        # The convert stage measures prompts with the policy's tokenizer against the prompt
        # length its rollouts take, unless the records section names its own.
        self.records = for_policy(self.records, self.training)
        return self


class RecipeError(ValueError):
    """A recipe that cannot be found or does not validate; the message names the fix."""


def available_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _locate(name_or_path: str | Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.suffix in {".yaml", ".yml"} or path.exists():
        if not path.is_file():
            raise RecipeError(f"recipe file {path} not found")
        return path
    packaged = RECIPES_DIR / f"{name_or_path}.yaml"
    if not packaged.is_file():
        raise RecipeError(
            f"no recipe named {name_or_path!r}; choose one of {', '.join(available_recipes())} "
            "or give the path of a YAML file"
        )
    return packaged


def _raw(name_or_path: str | Path, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    path = _locate(name_or_path)
    if str(path) in seen:
        raise RecipeError(f"recipe {path} extends itself through {' -> '.join(seen)}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a mapping of stage name to settings")
    parent = data.pop("extends", None)
    if parent:
        data = _deep_merge(_raw(parent, seen + (str(path),)), data)
    data.setdefault("name", path.stem)
    return data


def load_recipe(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    data = _raw(name_or_path)
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(f"recipe {name_or_path!r} does not validate:\n{exc}") from exc


def parse_override(text: str) -> dict[str, Any]:
    """``training.learning_rate=1e-6`` -> nested dict; the value is read as YAML."""
    if "=" not in text:
        raise RecipeError(f"override {text!r} must look like section.key=value")
    dotted, value = text.split("=", 1)
    node: dict[str, Any] = {}
    cur = node
    keys = dotted.strip().split(".")
    for key in keys[:-1]:
        cur = cur.setdefault(key, {})
    cur[keys[-1]] = yaml.safe_load(value)
    return node
