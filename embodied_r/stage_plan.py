"""A planned stage, its cache key, the plan of a run and the builder both pipelines plan with.

A stage's key hashes its own config (less its operational settings), the keys of the stages
it reads and the source of the library modules it runs (``runners.code_version``), so editing
a stage's config or code recomputes that stage and everything after it, and nothing before.

What a stage reads is declared once, by its kind (``StageKind.inputs``): the builder turns
those declarations into the stage's input paths and the stages it depends on, so no list of
dependencies is written anywhere else. A run builds its ``Plan`` once, where it starts, and
hands it to everything after it (the loop, the pools' flow runs, their shards, promotion and
the lifecycle commands) as JSON; nothing downstream plans again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from embodied_r.io import is_complete, payload_key
from embodied_r.runners import code_version, extra_key
from embodied_r.stage_kinds import MODEL, Pipeline, kind_of

PLAN_FILE = "plan.json"


class StageError(ValueError):
    """An unknown stage, or a stage asked for before the stages it reads from."""


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

    @property
    def params(self) -> dict[str, Any]:
        """What its MLflow run records as params. A stage whose trainer reports its own
        arguments into the same run (under ``trainer.``) keeps its recipe settings under the
        stage's kind (``warmstart.learning_rate`` beside ``trainer.learning_rate``), so the two
        read apart."""
        return {self.kind: self.config} if kind_of(self.kind).self_reporting else self.config


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


def stage_key(kind: str, keyed: dict[str, Any], upstream: list[str], extra: str = "",
              config: dict[str, Any] | None = None, inputs: dict[str, str] | None = None) -> str:
    """The 16-hex name of a stage's folder. ``config`` and ``inputs``, what the runner gets,
    pick the code it runs by name (a backend ``kind: world``, a model ``tiny:lm``)."""
    return payload_key({"kind": kind, "config": keyed, "upstream": upstream,
                        "code": code_version(kind, config, inputs), "extra": extra})


@dataclass(frozen=True)
class Ref:
    """One planned stage's folder (or a path inside it) as an input: the stage becomes a dependency."""

    stage: str
    path: str = ""


# What a stage's input may be given as: a literal (a path, a model reference), a planned
# stage's folder, or labels mapped to either (one JSON input).
Input = str | Ref | Mapping[str, "str | Ref"]


class PlanBuilder:
    """Stages added in run order under ``root/stages``, each reading what its kind declares
    (``StageKind.inputs``): a kind's last stage planned so far, a file in its folder, or the
    model the stages so far have reached (``model``: the last model-making stage's ``model/``,
    else what the pipeline starts from)."""

    def __init__(self, root: Path, model: str = ""):
        self.root = Path(root)
        self.stages: dict[str, StagePlan] = {}
        self.model: str | Ref = model

    def last(self, kind: str) -> str | None:
        return next((n for n in reversed(self.stages) if self.stages[n].kind == kind), None)

    def _declared(self, value: str) -> Input | None:
        """What a kind's declaration names (``MODEL``, ``<kind>`` or ``<kind>/<path>``), as
        this plan has it so far; None when the plan has no stage of that kind."""
        if value == MODEL:
            return self.model
        kind, _, sub = value.partition("/")
        stage = self.last(kind)
        return None if stage is None else Ref(stage, sub)

    def _resolve(self, name: str, value: Input) -> tuple[str, set[str]]:
        """An input's value and the stages it comes from. A mapping of labels to inputs is
        one JSON text of their values."""
        if isinstance(value, Mapping):
            found = {label: self._resolve(f"{name}.{label}", v) for label, v in value.items()}
            return json.dumps({label: f[0] for label, f in found.items()}), set().union(*(f[1] for f in found.values()))
        if isinstance(value, Ref):
            if value.stage not in self.stages:
                raise StageError(f"input {name!r} reads stage {value.stage!r}, which is not planned before it")
            out = Path(self.stages[value.stage].out)
            return str(out / value.path if value.path else out), {value.stage}
        return str(value), set()

    def add(self, name: str, kind: str, config: dict[str, Any], *, keyed: dict[str, Any],
            inputs: Mapping[str, Input] | None = None) -> StagePlan:
        """Plan stage ``name``: its kind's declared inputs, with ``inputs`` adding to or
        replacing them (a literal, a ``Ref`` to a planned stage, or a mapping of such as one
        JSON input). ``config`` is what the runner gets; ``keyed`` is it less its operational
        settings (``settings.result_settings``), so raising a limit or moving a server resumes
        the same folder; a kind with an ``extra_key`` is keyed by it too."""
        resolved: dict[str, str] = {}
        deps: set[str] = set()
        declared = {n: self._declared(v) for n, v in kind_of(kind).inputs.items()}
        given = {**{n: v for n, v in declared.items() if v is not None}, **(inputs or {})}
        for input_name, value in given.items():
            resolved[input_name], found = self._resolve(input_name, value)
            deps |= found
        ordered = [d for d in self.stages if d in deps]
        key = stage_key(kind, keyed, [self.stages[d].key for d in ordered], extra_key(kind, config), config, resolved)
        sp = StagePlan(name=name, kind=kind, key=key, out=str(self.root / "stages" / name / key),
                       deps=tuple(ordered), inputs=resolved, config=config)
        self.stages[name] = sp
        if kind_of(kind).makes_model:
            self.model = Ref(name, "model")
        return sp

    def plan(self, pipeline: Pipeline, recipe: dict[str, Any]) -> Plan:
        return Plan(self.stages, pipeline=pipeline, recipe=recipe, root=self.root)
