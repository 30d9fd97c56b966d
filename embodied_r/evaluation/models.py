"""Evaluating any model reference (a folder, ``tiny:lm``, a registry URI) on a split of converted
records, in a folder keyed like a stage's by what is evaluated, the config and the code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from embodied_r.benchmarks.base import OOD
from embodied_r.benchmarks.registry import EVALUATION_BENCHMARKS
from embodied_r.evaluation.config import EVALUATE, EvaluationConfig
from embodied_r.evaluation.stage import read_split, resolve_model_ref, run_evaluation
from embodied_r.io import keyed_folder
from embodied_r.code_keys import code_version, module_version


def evaluation_folder(root: Path, kind: str, identity: dict[str, Any], cfg: BaseModel) -> Path:
    """``<root>/evaluations/<kind>/<hash>`` of ``identity`` (model, records, ...), config and code."""
    config = cfg.model_dump(mode="json")
    return keyed_folder(Path(root) / "evaluations" / kind, {
        "kind": kind, "identity": identity, "config": config, "code": code_version(EVALUATE.runner, config, identity),
        "report": module_version("evaluation.report"), "baselines": module_version("lifecycle.baselines")})


@dataclass(frozen=True)
class Reasoner:
    identity: str  # what an evaluation folder is keyed by: immutable where possible
    path: str  # the local folder (or hub id) backends load
    label: str | None = None  # the registry version, for reports


def resolve_reasoner(ref: str, store: str) -> Reasoner:
    """Registry URIs (in ``store``) are pinned to the version their alias names now."""
    if ref.startswith("models:/"):
        from embodied_r.evaluation.registry import resolve_model_uri, resolve_version

        pinned = resolve_version(ref, store).uri
        return Reasoner(f"{pinned}@{store}", resolve_model_uri(pinned, store), pinned)
    resolved = resolve_model_ref(ref)
    return Reasoner(str(Path(resolved).resolve()) if Path(resolved).exists() else resolved, resolved)


def evaluate_model(ref: str, split: str, *, records: Path, cfg: EvaluationConfig, root: Path, store: str,
                   out: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """(folder, summary); the folder is keyed by the pinned model, the records and the config."""
    model = resolve_reasoner(ref, store)  # a model that is not there is said first
    if not read_split(records, split):
        fix = (f"name {' or '.join(EVALUATION_BENCHMARKS)} in download.benchmarks" if split == OOD
               else "choose another split")
        raise ValueError(f"the {split} split has no records ({records}); {fix}")
    cfg = cfg.model_copy(update={"split": split})
    out = out or evaluation_folder(root, "model", {"model": model.identity, "records": Path(records).name}, cfg)
    return out, run_evaluation(records, model.path, out, cfg, model_ref=model.label)
