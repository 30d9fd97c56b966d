"""The stage kinds of both pipelines, in run order: each declared once in the package that
runs it, listed here once. Tasks, flows, CLI commands, deployments and plans derive from it."""

from __future__ import annotations

from embodied_r.data.config import DOWNLOAD, PREPROCESS
from embodied_r.evaluation.config import EVALUATE, PROMOTE
from embodied_r.interactive.config import REASONER_DATA, REASONER_EVALUATE, REASONER_EXPLORE, REASONER_SFT
from embodied_r.keyframes.config import KEYFRAMES
from embodied_r.perception.config import PERCEPTION
from embodied_r.stage_plan import Pipeline, StageKind
from embodied_r.training.config import CONVERT, TRAIN, WARMSTART_KIND

KINDS: list[StageKind] = [DOWNLOAD, PREPROCESS, KEYFRAMES, PERCEPTION, CONVERT, WARMSTART_KIND, TRAIN, EVALUATE,
                          PROMOTE, REASONER_DATA, REASONER_SFT, REASONER_EXPLORE, REASONER_EVALUATE]


def kind_of(name: str) -> StageKind:
    found = next((k for k in KINDS if k.name == name), None)
    if found is None:
        raise ValueError(f"unknown stage kind {name!r}; kinds are {', '.join(k.name for k in KINDS)}")
    return found


def kinds(pipeline: Pipeline) -> tuple[StageKind, ...]:
    return tuple(k for k in KINDS if k.pipeline == pipeline)


def params(sp: object) -> dict:
    """What a stage's MLflow run records as params: a stage whose trainer reports its own
    arguments into the same run (``trainer.``) keeps its recipe settings under its kind's name."""
    return {sp.kind: sp.config} if kind_of(sp.kind).self_reporting else sp.config
