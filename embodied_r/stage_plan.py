"""A planned stage, its cache key and the builder both pipelines plan with.

A stage's key hashes its own config (less its operational settings), the keys of the stages
it reads and the source of the library modules it runs (``runners.code_version``), so editing
a stage's config or code recomputes that stage and everything after it, and nothing before.
Embodied-R (``pipeline.plan``) and Embodied-Reasoner (``interactive.recipe.plan``) both build
their graphs here, so a stage of either is the same object to the flows and tasks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from embodied_r.io import is_complete, payload_key
from embodied_r.runners import code_version
from embodied_r.stage_kinds import kind_of


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


def stage_key(kind: str, keyed: dict[str, Any], upstream: list[str], extra: str = "",
              config: dict[str, Any] | None = None, inputs: dict[str, str] | None = None) -> str:
    """The 16-hex name of a stage's folder. ``config`` and ``inputs``, what the runner gets,
    pick the code it runs by name (a backend ``kind: world``, a model ``tiny:lm``)."""
    return payload_key({"kind": kind, "config": keyed, "upstream": upstream,
                        "code": code_version(kind, config, inputs), "extra": extra})


class PlanBuilder:
    """Stages added in run order, each keyed by what it reads, under ``root/stages``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.stages: dict[str, StagePlan] = {}

    def add(self, name: str, kind: str, deps: list[str], config: dict[str, Any], inputs: dict[str, str],
            *, keyed: dict[str, Any], extra: str = "") -> StagePlan:
        # ``config`` is what the runner gets; ``keyed`` is it less its operational settings
        # (``settings.result_settings``), so raising a limit or moving a server resumes the
        # same folder instead of redoing every finished call.
        key = stage_key(kind, keyed, [self.stages[d].key for d in deps], extra, config, inputs)
        sp = StagePlan(name=name, kind=kind, key=key, out=str(self.root / "stages" / name / key),
                       deps=tuple(deps), inputs=inputs, config=config)
        self.stages[name] = sp
        return sp


def downstream(stages: dict[str, StagePlan], names: list[str]) -> list[str]:
    """``names`` and every stage that reads from them, directly or not, in run order."""
    hit = set(names)
    for sp in stages.values():
        if any(d in hit for d in sp.deps):
            hit.add(sp.name)
    return [s for s in stages if s in hit]
