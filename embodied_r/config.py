"""Typed recipes: one YAML file configures every stage; the model is assembled from the
stage kinds' declared sections (``stage_kinds``). Recipes ship in ``recipes/`` and may ``extends``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from embodied_r.benchmarks.base import OOD
from embodied_r.benchmarks.registry import EVALUATION_BENCHMARKS, evaluation_only
from embodied_r.errors import PromptsError, RecipeError
from embodied_r.explain import yaml_words
from embodied_r.merge import deep_merge
from embodied_r.prompts.store import PromptsConfig, apply_prompts

RECIPES_DIR = Path(__file__).parent / "recipes"
REASONER_RECIPES = RECIPES_DIR / "reasoner"  # apart from Embodied-R's, whose schema differs


class RecipeRules(BaseModel):
    """What holds across sections; the sections themselves are the stage kinds' (``Recipe``)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="after")
    def _records_for_policy(self) -> Any:
        # The convert stage measures prompts with the policy's tokenizer against the prompt
        # length its rollouts take, unless the records section names its own.
        from embodied_r.training.records_config import for_policy

        self.records = for_policy(self.records, self.training)
        return self

    @model_validator(mode="after")
    def _promotion_has_a_split(self) -> Any:
        # Promotion compares models on this split: without questions there it would fail
        # only after every stage had run.
        if self.tracking.promote and getattr(self.catalog.split, self.tracking.promote_split) == 0:
            split = self.tracking.promote_split
            raise ValueError(f"tracking.promote compares models on the {split} split, but catalog.split.{split} "
                             f"is 0: give it a share, set tracking.promote_split to another split, or "
                             "tracking.promote: false")
        return self

    @model_validator(mode="after")
    def _ood_has_a_benchmark(self) -> Any:
        # The ood split holds the evaluation-only benchmarks' questions and nothing else.
        if self.evaluation.split == OOD and not any(evaluation_only(b) for b in self.download.benchmarks):
            raise ValueError(f"evaluation.split is {OOD!r}, which holds the questions of "
                             f"{', '.join(EVALUATION_BENCHMARKS)} only, and download.benchmarks names none: add "
                             f"them (--set download.benchmarks=[{','.join(self.download.benchmarks)},"
                             f"{','.join(EVALUATION_BENCHMARKS)}]) or choose another split")
        return self

    @model_validator(mode="after")
    def _best_checkpoint_is_kept(self) -> Any:
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
        from embodied_r.training.chain import BEST_MODEL

        return BEST_MODEL if self.evaluation.checkpoint == "best_val" else "model"

    @model_validator(mode="after")
    def _finite_numbers(self) -> Any:
        # NaN passes every "> 0" check as False only by luck and inf passes them all: no
        # recipe number may be either, whichever package's model holds it.
        bad = [path for path, value in _numbers(self.model_dump()) if not math.isfinite(value)]
        if bad:
            raise ValueError(f"not a finite number: {', '.join(bad)}")
        return self

    @model_validator(mode="after")
    def _given_models_are_not_promoted(self) -> Any:
        # Promotion registers the last training stage's model; a recipe that evaluates a
        # given model (evaluation.model) trains none.
        if self.evaluation.model is not None and self.tracking.promote:
            raise ValueError("evaluation.model evaluates a given model and trains none, so there is nothing to "
                             "promote: set tracking.promote: false")
        return self


_MODELS: dict[tuple[int, ...], type[RecipeRules]] = {}


def recipe_model(declared: tuple[Any, ...] | None = None) -> type[RecipeRules]:
    """The Embodied-R recipe model of these stage kinds (default: the pipeline's), each kind's
    section in run order; loading it imports the sections' configs, never a runner."""
    from embodied_r.stage_kinds import kinds
    from embodied_r.training.config import SFTConfig

    declared = kinds("embodied-r") if declared is None else declared
    if (made := _MODELS.get(tuple(map(id, declared)))) is not None:
        return made
    sections: dict[str, Any] = {}
    for kind in declared:
        if kind.section is not None and kind.section not in sections:
            sections[kind.section] = ((kind.config | None, None) if kind.optional
                                      else (kind.config, Field(default_factory=kind.config)))
    made = _MODELS[tuple(map(id, declared))] = create_model(
        "Recipe", __base__=RecipeRules, name=(str, ...), description=(str, ""), **sections,
        # The SFT baseline (`embodied-r sft`); None takes the training environment and step cap.
        sft=(SFTConfig | None, None),
        # The original texts from the user's checkout (``prompts.file``), or this project's own.
        prompts=(PromptsConfig, Field(default_factory=PromptsConfig)),
        # Evaluation sets a model never trained on (another benchmark, a held-out task family),
        # each the dotted ``--set`` overrides of an evaluation-only run of it.
        out_of_distribution=(dict[str, dict[str, Any]], Field(default_factory=dict)))
    return made


def __getattr__(name: str) -> Any:
    if name == "Recipe":  # made when first asked for: a command that reads no recipe imports no config
        return recipe_model()
    raise AttributeError(name)


def backend_problems(recipe: Any, kinds_run: set[str] | None = None) -> list[str]:
    """``section: what it lacks`` for each backend the stages of ``kinds_run`` (None: all) would
    start and could not, in this environment (a server's URL, an API key). Before a run only
    (``kinds_run`` given), what a section needs besides (``missing_before_run``)."""
    from embodied_r.stage_kinds import kinds

    found, besides = [], []
    for kind in kinds(recipe_pipeline(recipe)):
        section = getattr(recipe, kind.section, None) if kind.section else None
        if section is None or (kinds_run is not None and kind.name not in kinds_run):
            continue
        for name, backend, needs_model in getattr(section, "backends", lambda: [])():
            where = f"{kind.section}.{name}"
            if backend is not None and (problem := backend.unready(needs_model)):
                found.append(f"{where}: {problem}; set it in the recipe or with --set {where}.base_url=URL")
        if kinds_run is not None:
            besides += getattr(section, "missing_before_run", lambda: [])()
    return found + besides


def recipe_pipeline(recipe: Any) -> str:
    return "embodied-r" if isinstance(recipe, RecipeRules) else "embodied-reasoner"


def _numbers(node: Any, path: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _numbers(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _numbers(value, f"{path}[{i}]")
    elif isinstance(node, float):
        yield path, node


# libyaml's loader where PyYAML was built with it: a tenth of the pure-Python parse time.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def available_recipes(folder: Path = RECIPES_DIR) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def description(name: str, folder: Path = RECIPES_DIR) -> str:
    """A packaged recipe's description, read from its files (``extends`` followed), unvalidated."""
    return str(_raw(name, folder).get("description", ""))


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
    text = path.read_text()
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError:
        # The pure-Python parser's words for what is wrong, the same whichever parser PyYAML has.
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise RecipeError(f"recipe {path} is not valid YAML at {yaml_words(exc)}: fix it there") from exc
        raise
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


def raw_recipe(name_or_path: str | Path, overrides: dict[str, Any] | None = None,
               folder: Path = RECIPES_DIR) -> dict[str, Any]:
    """A recipe's settings as written: its ``extends`` chain and ``overrides`` merged, unvalidated."""
    data = _raw(name_or_path, folder)
    return deep_merge(data, nested(overrides)) if overrides else data


def load_as(schema: type[Schema], name_or_path: str | Path, overrides: dict[str, Any] | None = None, *,
            folder: Path = RECIPES_DIR, reasoner: bool = False) -> Schema:
    """The one recipe loader of both pipelines: a packaged name (in ``folder``) or a YAML
    path, its ``extends`` chain and ``overrides`` merged, the original texts applied
    (``prompts``), validated as ``schema`` with one line naming every wrong entry."""
    data = raw_recipe(name_or_path, overrides, folder)
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


def load_recipe(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> Any:
    return load_as(recipe_model(), name_or_path, overrides)


def load_reasoner(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> Any:
    from embodied_r.interactive.config import ReasonerRecipe

    return load_as(ReasonerRecipe, name_or_path, overrides, folder=REASONER_RECIPES, reasoner=True)


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
