"""Typed recipes: one YAML file configures every stage.

Recipes ship inside the package (``embodied_r/recipes/*.yaml``); a recipe may
``extends: <name>`` another and override only what differs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from embodied_r.benchmark_rules import EVALUATION_BENCHMARKS, OOD, evaluation_only
from embodied_r.data.catalog import CatalogConfig
from embodied_r.data.download import DownloadConfig
from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.explain import yaml_words
from embodied_r.evaluation.registry import MODEL_NAME
from embodied_r.keyframes.extract import KeyframeConfig
from embodied_r.perception.stage import PerceptionConfig
from embodied_r.prompts.store import PromptsConfig, apply_prompts
from embodied_r.prompts.locate import PromptsError
from embodied_r.settings import operational
from embodied_r.tracking.link import DEFAULT_OUTAGE_S
from embodied_r.training.records import RecordsConfig, for_policy
from embodied_r.training.config import SFTConfig
from embodied_r.training.config import TrainingConfig
from embodied_r.training.chain import BEST_MODEL
from embodied_r.training.warmstart import WarmstartConfig

RECIPES_DIR = Path(__file__).parent / "recipes"


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    experiment: str = "embodied-r"
    # None: $MLFLOW_TRACKING_URI, else a SQLite store under the project home.
    tracking_uri: str | None = None
    registered_model: str = MODEL_NAME
    # After evaluation, register the trained reasoner (once per model) and give it the
    # champion alias when it beats chance, the warm-started policy (recipes with a warm
    # start) and the current champion on ``promote_split``.
    promote: bool = False
    promote_split: Literal["train", "val", "test"] = "val"
    promote_metric: str = "accuracy/overall"
    # How long a run waits for a tracking server that stopped answering (a restart takes
    # minutes); what it would have logged meanwhile is kept and sent once it answers.
    outage_s: float = operational(DEFAULT_OUTAGE_S, ge=0)


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    download: DownloadConfig = Field(default_factory=DownloadConfig)
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    keyframes: KeyframeConfig = Field(default_factory=KeyframeConfig)
    perception: PerceptionConfig = Field(default_factory=PerceptionConfig)
    records: RecordsConfig = Field(default_factory=RecordsConfig)
    # A short SFT on reasoning traces before the GRPO stages (None: GRPO from the policy as it is).
    warmstart: WarmstartConfig | None = None
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    # The SFT baseline (`embodied-r sft`); None takes the training environment and step cap.
    sft: SFTConfig | None = None
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    # The original texts from the user's checkout (``prompts.file``), or this project's own.
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    # Evaluation sets a trained model never trained on, each the overrides (dotted keys as
    # ``--set`` writes them) that make an evaluation-only run of it: another benchmark, or a
    # task family the catalog leaves out of training. Experiments evaluate on them
    # (``out_of_distribution: true``); the pipeline itself does not.
    out_of_distribution: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _records_for_policy(self) -> "Recipe":
        # The convert stage measures prompts with the policy's tokenizer against the prompt
        # length its rollouts take, unless the records section names its own.
        self.records = for_policy(self.records, self.training)
        return self

    @model_validator(mode="after")
    def _promotion_has_a_split(self) -> "Recipe":
        # Promotion compares models on this split: without questions there it would fail
        # only after every stage had run.
        if self.tracking.promote and getattr(self.catalog.split, self.tracking.promote_split) == 0:
            split = self.tracking.promote_split
            raise ValueError(f"tracking.promote compares models on the {split} split, but catalog.split.{split} "
                             f"is 0: give it a share, set tracking.promote_split to another split, or "
                             "tracking.promote: false")
        return self

    @model_validator(mode="after")
    def _ood_has_a_benchmark(self) -> "Recipe":
        # The ood split holds the evaluation-only benchmarks' questions and nothing else.
        if self.evaluation.split == OOD and not any(evaluation_only(b) for b in self.download.benchmarks):
            raise ValueError(f"evaluation.split is {OOD!r}, which holds the questions of "
                             f"{', '.join(EVALUATION_BENCHMARKS)} only, and download.benchmarks names none: add "
                             f"them (--set download.benchmarks=[{','.join(self.download.benchmarks)},"
                             f"{','.join(EVALUATION_BENCHMARKS)}]) or choose another split")
        return self

    @model_validator(mode="after")
    def _best_checkpoint_is_kept(self) -> "Recipe":
        if self.evaluation.checkpoint == "best_val" and not self.training.keep_best:
            raise ValueError("evaluation.checkpoint: best_val evaluates the checkpoint kept by validation: "
                             "set training.keep_best: true (with training.eval_steps), or checkpoint: last")
        return self

    def evaluation_settings(self) -> Any:
        """The evaluation config as every evaluation of the reasoner uses it: prompts cut as
        training cuts them (``training.max_prompt_length``) unless the evaluation sets its
        own limit, so a model is asked what it was trained on, in the pipeline and out of it."""
        if self.evaluation.max_prompt_length is not None:
            return self.evaluation
        return self.evaluation.model_copy(update={"max_prompt_length": self.training.max_prompt_length})

    def evaluated_checkpoint(self) -> str:
        """Which folder of the last training stage the evaluation answers with."""
        return BEST_MODEL if self.evaluation.checkpoint == "best_val" else "model"

    @model_validator(mode="after")
    def _finite_numbers(self) -> "Recipe":
        # NaN passes every "> 0" check as False only by luck and inf passes them all: no
        # recipe number may be either, whichever package's model holds it.
        bad = [path for path, value in _numbers(self.model_dump()) if not math.isfinite(value)]
        if bad:
            raise ValueError(f"not a finite number: {', '.join(bad)}")
        return self

    @model_validator(mode="after")
    def _given_models_are_not_promoted(self) -> "Recipe":
        # Promotion registers the last training stage's model; a recipe that evaluates a
        # given model (evaluation.model) trains none.
        if self.evaluation.model is not None and self.tracking.promote:
            raise ValueError("evaluation.model evaluates a given model and trains none, so there is nothing to "
                             "promote: set tracking.promote: false")
        return self


def backend_problems(recipe: Recipe, kinds: set[str] | None = None) -> list[str]:
    """``section: what it lacks`` for each backend the stages of ``kinds`` (None: all) would
    start and could not, in this environment (a server's URL, an API key)."""
    used = [("perception", "perception.backend", recipe.perception.backend, True),
            ("train", "training.reference", recipe.training.reference, True),
            # The evaluated model is the trained one: its name is filled in by the pipeline.
            ("evaluate", "evaluation.backend", recipe.evaluation.backend, False),
            ("evaluate", "evaluation.consistency_judge", recipe.evaluation.consistency_judge, True)]
    found = []
    for kind, where, backend, needs_model in used:
        if backend is not None and (kinds is None or kind in kinds):
            if problem := backend.unready(needs_model):
                found.append(f"{where}: {problem}; set it in the recipe or with --set {where}.base_url=URL")
    # Before a run only (``kinds`` given): a recipe that needs the user's own prompts file
    # still validates, and its run stops now rather than after the key frames.
    if kinds is not None and "perception" in kinds and recipe.perception.texts_required and recipe.perception.texts is None:
        found.append("prompts.file: this recipe needs the original texts; write them with `embodied-r prompts "
                     "import-official PATH` (your clone of EmbodiedCity/Embodied-R.code) and add --set prompts.file=FILE")
    return found


def _numbers(node: Any, path: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _numbers(value, f"{path}[{i}]")
    elif isinstance(node, float):
        yield path, node


class RecipeError(ValueError):
    """A recipe that cannot be found or does not validate; the message names the fix."""


def available_recipes(folder: Path = RECIPES_DIR) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base``, mappings key by key. A mapping over a list changes items
    of that list: by position (``"2"``), by the item's ``name`` (``stage3``), or every item
    (``"*"``), so ``--set training.stages.stage3.rewards.consistency=0`` changes one stage and
    keeps the others; any other value replaces what it lands on."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        elif isinstance(value, dict) and isinstance(out.get(key), list) and value:
            out[key] = _merge_items(out[key], value, key)
        else:
            out[key] = value
    return out


def _merge_items(items: list[Any], over: dict[str, Any], where: str) -> list[Any]:
    out = list(items)
    names = {item.get("name"): i for i, item in enumerate(out) if isinstance(item, dict) and "name" in item}
    for selector, value in over.items():
        if selector == "*":
            picked = range(len(out))
        elif str(selector).isdigit() and int(selector) < len(out):
            picked = [int(selector)]
        elif selector in names:
            picked = [names[selector]]
        else:
            known = ", ".join(str(n) for n in names) or f"0..{len(out) - 1}"
            raise RecipeError(f"{where}.{selector}: no such item in {where}; name one of {known}, a position, or *")
        for i in picked:
            out[i] = deep_merge(out[i], value) if isinstance(value, dict) and isinstance(out[i], dict) else value
    return out


def _locate(name_or_path: str | Path, folder: Path) -> Path:
    path = Path(name_or_path).expanduser()
    if path.suffix in {".yaml", ".yml"} or path.exists():
        if not path.is_file():
            raise RecipeError(f"recipe file {path} not found")
        return path
    packaged = folder / f"{name_or_path}.yaml"
    if not packaged.is_file():
        raise RecipeError(
            f"no recipe named {name_or_path!r}; choose one of {', '.join(available_recipes(folder))} "
            "or give the path of a YAML file"
        )
    return packaged


def _beside(recipe: Path, parent: str) -> str | Path:
    """``extends`` names a packaged recipe, or a file found relative to the recipe that
    extends it (never to the current folder, which would pick a stranger's base.yaml)."""
    candidate = recipe.parent / Path(parent).expanduser()
    if Path(parent).suffix in {".yaml", ".yml"} or "/" in parent or candidate.exists():
        return candidate
    return parent


def _raw(name_or_path: str | Path, folder: Path, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    path = _locate(name_or_path, folder)
    if str(path) in seen:
        raise RecipeError(f"recipe {path} extends itself through {' -> '.join(seen)}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {path} is not valid YAML at {yaml_words(exc)}: fix it there") from exc
    if data is None or data == {}:
        # Nothing set would silently run the paper's whole setup (hub download, a 72B VLM).
        raise RecipeError(f"recipe {path} is empty: write the settings you mean, or `extends: paper` "
                          "(or demo, smoke, ...) to start from a shipped recipe")
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path} must be a mapping of stage name to settings")
    parent = data.pop("extends", None)
    if parent:
        data = deep_merge(_raw(_beside(path, str(parent)), folder, seen + (str(path),)), data)
    data.setdefault("name", path.stem)
    return data


Schema = TypeVar("Schema", bound=BaseModel)


def load_as(schema: type[Schema], name_or_path: str | Path, overrides: dict[str, Any] | None = None, *,
            folder: Path = RECIPES_DIR, reasoner: bool = False) -> Schema:
    """The one recipe loader of both pipelines: a packaged name (in ``folder``) or a YAML
    path, its ``extends`` chain and ``overrides`` merged, the original texts applied
    (``prompts``), validated as ``schema`` with one line naming every wrong entry."""
    data = _raw(name_or_path, folder)
    if overrides:
        data = deep_merge(data, nested(overrides))
    try:
        data = apply_prompts(data, deep_merge, reasoner=reasoner)
    except PromptsError as exc:
        raise RecipeError(f"recipe {name_or_path!r}: {exc}") from None
    return validated(schema, data, f"recipe {name_or_path!r}")


def validated(schema: type[Schema], data: Any, what: str) -> Schema:
    """``data`` as ``schema``, or a RecipeError of one line: each wrong entry named by its
    path, with pydantic's reason."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        wrong = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or what.split()[0]}: "
                          f"{err['msg'].removeprefix('Value error, ')}" for err in exc.errors())
        raise RecipeError(f"{what} does not validate: {wrong}") from None


def load_recipe(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> Recipe:
    return load_as(Recipe, name_or_path, overrides)


def nested(overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides whose keys may be dotted paths, as ``--set`` writes them and a deployment's
    ``overrides`` parameter takes them (``{"training.learning_rate": 1e-6}``), as one nested
    dict; a key without a dot stays as it is."""
    merged: dict[str, Any] = {}
    for key, value in overrides.items():
        for part in reversed(str(key).split(".")[1:]):
            value = {part: value}
        merged = deep_merge(merged, {str(key).split(".")[0]: value})
    return merged


def parse_override(text: str) -> dict[str, Any]:
    """``training.learning_rate=1e-6`` -> nested dict; the value is read as YAML."""
    if "=" not in text:
        raise RecipeError(f"override {text!r} must look like section.key=value")
    dotted, value = text.split("=", 1)
    node: dict[str, Any] = {}
    cur = node
    keys = dotted.strip().split(".")
    if not all(k.strip() for k in keys):
        raise RecipeError(f"override {text!r}: the key must look like section.key")
    for key in keys[:-1]:
        cur = cur.setdefault(key, {})
    try:
        cur[keys[-1]] = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        first = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise RecipeError(f"override {text!r}: the value is not valid YAML ({first}); quote it or fix it") from None
    return node


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Every ``--set`` pair merged in order into one nested dict (a later pair wins)."""
    merged: dict[str, Any] = {}
    for pair in pairs:
        merged = deep_merge(merged, parse_override(pair))
    return merged
