"""A stage kind's declaration, a planned stage and its key, a run's plan, and the builder.

A key hashes a stage's config less its operational settings, the keys of the stages it reads
and the code it runs, so an edit recomputes that stage and what reads it, nothing before."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping

from embodied_r.errors import StageError
from embodied_r.io import is_complete, payload_key
from embodied_r.settings import result_settings
from embodied_r.code_keys import code_version, extra_key

Pool = Literal["cpu", "gpu-infer", "gpu-train"]
# Which figure a stage's done line leads with: an evaluation's accuracy, a trainer's steps
# and why it stopped, or items done and failed.
Headline = Literal["items", "training", "accuracy"]
Pipeline = Literal["embodied-r", "embodied-reasoner"]
REFRESH_NOTE = "Set refresh=true to recompute it and discard what depends on it."
# An input that is the model the stages before have reached: the ``model/`` of the last stage
# of a kind that ``makes_model``, else the model the pipeline starts from.
MODEL = "model"
# A backend's ``model`` naming the warm start's model (frozen): the consistency reference of
# training and evaluation's judge, taught the reference's task beside the policy's.
WARMSTART = "warmstart"
# The figures a stage's Prefect summary shows first (``StageKind.figures``), by what it makes.
TIMING = ("split", "seconds", "seconds_per_step")
ITEMS = ("items", "videos", "done", "failed", "keyframes_mean", "questions", "records") + TIMING
TRAINING = ("steps", "epochs_reached", "stopped_by", "final_reward", "final_rewards_format_reward_mean",
            "final_rewards_accuracy_reward_mean", "final_kl", "done", "failed") + TIMING
ACCURACY = ("accuracy/overall", "accuracy/macro", "accuracy/paper_tasks", "count/overall", "done", "failed") + TIMING


@dataclass(frozen=True)
class StageKind:
    """One kind of stage, declared once beside its config model in the package that runs it."""

    name: str
    runner: str  # "module:function", called as (out, config, inputs, mlflow_run_id) -> summary
    pool: Pool
    help: str  # the CLI's help line; the deployment's description starts with it
    # The recipe section it is configured by (None: none of its own), with that section's model.
    section: str | None = None
    config: Any = None
    optional: bool = False  # the section may be null: the recipe leaves the stage out
    # How a recipe becomes this kind's stages: ``expand(recipe, builder, kind)`` adds them. None:
    # one stage named after the kind, configured by its section.
    expand: Callable[..., None] | None = None
    # What it reads, by input name: "<kind>" the folder of that kind's last stage planned before
    # it, "<kind>/<path>" a path inside that folder, MODEL the model reached so far. An input
    # whose kind has no stage in a plan (an optional stage) is left out.
    inputs: Mapping[str, str] = field(default_factory=dict)
    makes_model: bool = False  # its folder's model/ is what the stages after it start from
    retries: int = 0  # whole-stage retries: each resumes per item, so one is cheap
    retry_delay_s: int = 0
    unit: str = "items"  # what its progress counts, as an interrupted run says it
    headline: Headline = "items"
    pipeline: Pipeline = "embodied-r"
    # What keys it beyond its config and code, as "module:function" of its config dict (the
    # download stage's local mirror).
    extra_key: str | None = None
    figures: tuple[str, ...] = ()  # its Prefect summary's first figures, in order
    # Its trainer child logs its own arguments into the stage's MLflow run (under ``trainer.``),
    # so the recipe's settings go under the kind's name, to read apart.
    self_reporting: bool = False
    # Its runs chart per-step curves: its summary's single figures are params, not one-point charts.
    summary_as_params: bool = False
    # "module:function": what it shows on the run's MLflow parent when it is the run's last evaluation.
    parent_view: str | None = None
    command: bool = True  # a CLI command of its own (``embodied-r <kind>``)
    # Its result lives in the MLflow store (the registry): with the store lost the run leaves it
    # to the rerun instead of failing on it.
    needs_tracking: bool = False

    @property
    def flow_name(self) -> str:
        return f"embodied-r-{self.name}" if self.pipeline == "embodied-r" else "embodied-reasoner-stage"

    @property
    def deployment_name(self) -> str:
        return self.name if self.pipeline == "embodied-r" else self.name.removeprefix("reasoner_")

    @property
    def deployment(self) -> str:
        """``<flow>/<deployment>`` as ``run_deployment`` and ``prefect deployment run`` take it."""
        return f"{self.flow_name}/{self.deployment_name}"

    @property
    def entrypoint(self) -> str:
        return (f"flows/stages.py:{self.name}_flow" if self.pipeline == "embodied-r"
                else "flows/reasoner.py:reasoner_stage")

    @property
    def description(self) -> str:
        return f"{self.help[0].upper()}{self.help[1:]}. {REFRESH_NOTE}"


PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class StagePlan:
    name: str  # "download", ..., "train_stage1", ..., "evaluate"
    kind: str  # a name in stage_kinds.STAGE_KINDS
    key: str
    out: str
    deps: tuple[str, ...]
    inputs: dict[str, str] = field(default_factory=dict)  # named input paths or model refs
    config: dict[str, Any] = field(default_factory=dict)  # this stage's config only

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StagePlan":
        return cls(**{**data, "deps": tuple(data["deps"])})

    @property
    def complete(self) -> bool:
        return is_complete(Path(self.out))

class Plan(dict[str, StagePlan]):
    """A run's stages in run order (a dict of name to ``StagePlan``), with the recipe they were
    planned from (as the recipe's JSON), the pipeline and the project home."""

    def __init__(self, stages: Mapping[str, StagePlan], *, pipeline: Pipeline, recipe: dict[str, Any], root: Path):
        super().__init__(stages)
        self.pipeline, self.recipe, self.root = pipeline, recipe, Path(root)

    @property
    def recipe_name(self) -> str:
        return str(self.recipe.get("name", ""))

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "recipe": self.recipe, "root": str(self.root),
                "stages": [sp.to_dict() for sp in self.values()]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> "Plan":
        data = json.loads(data) if isinstance(data, str) else data
        stages = (StagePlan.from_dict(s) for s in data["stages"])
        return cls({sp.name: sp for sp in stages}, pipeline=data["pipeline"], recipe=data["recipe"],
                   root=Path(data["root"]))

    def of_kind(self, kind: str) -> list[str]:
        return [n for n, sp in self.items() if sp.kind == kind]

    def resolve(self, name: str) -> str:
        """A stage's name, its kind (the kind's first stage: ``train`` is ``train_stage1``) or
        its name without the pipeline's prefix (``sft_correction``)."""
        if name in self:
            return name
        found = self.of_kind(name) or [n for n in self if n.removeprefix("reasoner_") == name]
        if not found:
            raise StageError(f"unknown stage {name!r}; stages are {', '.join(self)}")
        return found[0]

    def named(self, names: Iterable[str]) -> list[str]:
        """Stages by name, kind or short name, every stage of a kind named (``train``, ``sft``,
        ``evaluate`` with its baselines), in run order."""
        wanted: set[str] = set()
        for name in names:
            kind = next((k for k in (name, f"reasoner_{name}") if self.of_kind(k)), None)
            wanted.update(self.of_kind(kind) if kind else [self.resolve(name)])
        return [n for n in self if n in wanted]

    def select(self, only: Iterable[str] | None) -> list[str]:
        """The stages to run (all by default), each one's inputs done or run too."""
        selected = self.named(only) if only else list(self)
        for name in selected:
            missing = [d for d in self[name].deps if d not in selected and not self[d].complete]
            if missing:
                recipe = self.recipe_name
                first = self[missing[0]]
                run = (f"`embodied-r {first.kind} --recipe {recipe}` first, or the whole pipeline with "
                       f"`embodied-r run --recipe {recipe}`" if self.pipeline == "embodied-r" else
                       f"`embodied-r reasoner --recipe {recipe}` first")
                raise StageError(f"stage {name!r} reads the output of {', '.join(missing)}, which has not been "
                                 f"run with this recipe: run {run}")
        return selected

    def downstream(self, names: Iterable[str]) -> list[str]:
        """``names`` (resolved) and every stage that reads from them, directly or not, in run order."""
        return downstream(self, [self.resolve(n) for n in names])

    def save(self, folder: Path) -> Path:
        """The plan as ``folder/plan.json`` (what the run's MLflow parent keeps)."""
        from embodied_r.io import write_json_atomic

        path = Path(folder) / PLAN_FILE
        write_json_atomic(path, self.to_json())
        return path


def downstream(stages: Mapping[str, StagePlan], names: list[str]) -> list[str]:
    """``names`` and every stage that reads from them, directly or not, in run order."""
    hit = set(names)
    for sp in stages.values():
        if any(d in hit for d in sp.deps):
            hit.add(sp.name)
    return [s for s in stages if s in hit]


def stage_key(kind: StageKind, keyed: dict[str, Any], upstream: list[str], extra: str = "",
              config: dict[str, Any] | None = None, inputs: dict[str, str] | None = None) -> str:
    """The 16-hex name of a stage's folder. ``config`` and ``inputs``, what the runner gets,
    pick the code it runs by name (a backend ``kind: world``, a model ``tiny:lm``)."""
    return payload_key({"kind": kind.name, "config": keyed, "upstream": upstream,
                        "code": code_version(kind.runner, config, inputs), "extra": extra})


@dataclass(frozen=True)
class Ref:
    """A planned stage's folder (or a path inside it), in a stage's inputs or anywhere in its
    config: the stage becomes a dependency, the runner gets the path and the key the reference."""

    stage: str
    path: str = ""

    @property
    def named(self) -> str:
        return f"{self.stage}/{self.path}" if self.path else self.stage


# What a stage's input may be given as: a literal (a path, a model reference), a planned
# stage's folder, or labels mapped to either (one JSON input).
Input = str | Ref | Mapping[str, "str | Ref"]


class PlanBuilder:
    """Stages added in run order under ``root/stages``, each reading what its kind declares
    (``StageKind.inputs``) and what its config references (``Ref``)."""

    def __init__(self, root: Path, model: str = ""):
        self.root = Path(root)
        self.stages: dict[str, StagePlan] = {}
        self.model: str | Ref = model

    def last(self, kind: str) -> str | None:
        return next((n for n in reversed(self.stages) if self.stages[n].kind == kind), None)

    def _declared(self, value: str) -> Input | None:
        """What a declaration names (``MODEL``, ``<kind>`` or ``<kind>/<path>``) as this plan
        has it so far; None when the plan has no stage of that kind."""
        if value == MODEL:
            return self.model
        kind, _, sub = value.partition("/")
        stage = self.last(kind)
        return None if stage is None else Ref(stage, sub)

    def warm_model(self, where: str) -> Ref:
        """The warm start's model, for a backend at ``where`` whose ``model`` says ``warmstart``."""
        if WARMSTART not in self.stages:
            raise StageError(f"{where}.model is {WARMSTART!r} but the recipe has no warmstart section")
        return Ref(WARMSTART, "model")

    def path(self, ref: Ref, where: str) -> str:
        if ref.stage not in self.stages:
            raise StageError(f"{where} reads stage {ref.stage!r}, which is not planned before it")
        out = Path(self.stages[ref.stage].out)
        return str(out / ref.path if ref.path else out)

    def _resolve(self, name: str, value: Input) -> tuple[str, set[str]]:
        """An input's value and the stages it comes from; labels mapped to inputs are one JSON text."""
        if isinstance(value, Mapping):
            found = {label: self._resolve(f"{name}.{label}", v) for label, v in value.items()}
            return json.dumps({label: f[0] for label, f in found.items()}), set().union(*(f[1] for f in found.values()))
        if isinstance(value, Ref):
            return self.path(value, f"input {name!r}"), {value.stage}
        return str(value), set()

    def _bind(self, value: Any, deps: set[str], where: str, keyed: bool) -> Any:
        """``value`` with each ``Ref`` in it made the runner's path (or, for the key, the
        reference itself: a moved home keeps its keys); its stages join ``deps``."""
        if isinstance(value, Ref):
            deps.add(value.stage)
            return {"stage_output": value.named} if keyed else self.path(value, where)
        if isinstance(value, dict):
            return {k: self._bind(v, deps, f"{where}.{k}", keyed) for k, v in value.items()}
        if isinstance(value, list):
            return [self._bind(v, deps, where, keyed) for v in value]
        return value

    def add(self, kind: StageKind, name: str, config: dict[str, Any], *, keyed: dict[str, Any],
            inputs: Mapping[str, Input] | None = None) -> StagePlan:
        """Plan stage ``name``: its kind's declared inputs, with ``inputs`` adding to or replacing
        them. ``config`` is what the runner gets; ``keyed`` is it less its operational settings
        (``settings.result_settings``); a kind with an ``extra_key`` is keyed by it too."""
        resolved: dict[str, str] = {}
        deps: set[str] = set()
        declared = {n: self._declared(v) for n, v in kind.inputs.items()}
        given = {**{n: v for n, v in declared.items() if v is not None}, **(inputs or {})}
        for input_name, value in given.items():
            resolved[input_name], found = self._resolve(input_name, value)
            deps |= found
        config = self._bind(config, deps, name, keyed=False)
        keyed = self._bind(keyed, deps, name, keyed=True)
        ordered = [d for d in self.stages if d in deps]
        key = stage_key(kind, keyed, [self.stages[d].key for d in ordered], extra_key(kind.extra_key, config),
                        config, resolved)
        sp = StagePlan(name=name, kind=kind.name, key=key, out=str(self.root / "stages" / name / key),
                       deps=tuple(ordered), inputs=resolved, config=config)
        self.stages[name] = sp
        if kind.makes_model:
            self.model = Ref(name, "model")
        return sp

    def plan(self, pipeline: Pipeline, recipe: dict[str, Any]) -> Plan:
        return Plan(self.stages, pipeline=pipeline, recipe=recipe, root=self.root)


def plan_stages(declared: tuple[StageKind, ...], recipe: Any, root: Path, model: str) -> Plan:
    """A recipe's stages in run order: each kind's expansion in turn, or, for a kind without one,
    one stage named after it, configured by its section (left out where an optional section is
    null; a kind without a section gets an empty config)."""
    builder = PlanBuilder(root, model=model)
    for kind in declared:
        if kind.expand is not None:
            kind.expand(recipe, builder, kind)
            continue
        section = getattr(recipe, kind.section) if kind.section else None
        if section is None and kind.optional:
            continue
        config, keyed = ({}, {}) if section is None else (section.model_dump(mode="json"), result_settings(section))
        builder.add(kind, kind.name, config, keyed=keyed)
    as_json = recipe.model_dump(mode="json")
    _VALIDATED[_recipe_text(as_json)] = recipe
    return builder.plan(declared[0].pipeline, as_json)


# The recipes this process validated, by their JSON: a plan handed on as JSON (to the flow, to a
# stage's task) is turned back into the same recipe without validating it again.
_VALIDATED: dict[str, Any] = {}


def _recipe_text(recipe: dict[str, Any]) -> str:
    return json.dumps(recipe, sort_keys=True, default=str)


def validated_recipe(stages: Plan) -> Any | None:
    """The recipe object ``stages`` was planned from in this process, if it was."""
    return _VALIDATED.get(_recipe_text(stages.recipe))
