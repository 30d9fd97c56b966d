"""A recipe's converted records and trained reasoner, and evaluation of any model reference
(a folder, ``tiny:lm``, a registry URI) in a folder named by what is evaluated."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from embodied_r.evaluation.registry import CHAMPION_URI
from embodied_r.evaluation.stage import read_split, resolve_model_ref, run_evaluation
from embodied_r.io import keyed_folder
from embodied_r.pipeline import StageError, plan, training_stage_names
from embodied_r.runners import code_version, module_version


def evaluation_folder(root: Path, kind: str, identity: dict[str, Any], cfg: BaseModel) -> Path:
    """``<root>/evaluations/<kind>/<hash>``: a folder named by what is evaluated (``identity``:
    model, records, ...), the config and the code, like a pipeline stage's folder."""

    config = cfg.model_dump(mode="json")
    return keyed_folder(Path(root) / "evaluations" / kind, {
        "kind": kind, "identity": identity, "config": config, "code": code_version("evaluate", config, identity),
        "report": module_version("evaluation.report"), "baselines": module_version("lifecycle.baselines")})


def trained_model(recipe: Any, root: Path) -> str:
    """The recipe's last trained stage's model folder; raises when it has not been trained."""

    stages = plan(recipe, root)
    last = stages[training_stage_names(stages)[-1]]
    if not last.complete:
        raise StageError(
            f"recipe {recipe.name!r} has no trained reasoner yet ({last.name} not run): pass a model "
            f"(a folder, tiny:lm, {CHAMPION_URI}) or run `embodied-r run --recipe {recipe.name}` first")
    return str(Path(last.out) / "model")


def converted_records(recipe: Any, root: Path) -> Path:
    """The recipe's convert-stage folder; raises when it has not been run."""

    convert = plan(recipe, root)["convert"]
    if not convert.complete:
        raise StageError(f"no converted records for recipe {recipe.name!r}: run `embodied-r convert --recipe "
                         f"{recipe.name}` (or the whole pipeline) first")
    return Path(convert.out)


@dataclass(frozen=True)
class Reasoner:
    identity: str  # what an evaluation folder is keyed by: immutable where possible
    path: str  # the local folder (or hub id) backends load
    label: str | None = None  # the registry version, for reports


def resolve_reasoner(ref: str | None, recipe: Any, root: Path) -> Reasoner:
    """Where a model reference points (default: the recipe's trained model); registry URIs
    are pinned to the version their alias names now."""
    ref = ref or trained_model(recipe, root)
    if ref.startswith("models:/"):
        from embodied_r.evaluation.registry import resolve_model_uri, resolve_version
        from embodied_r.tracking import tracking_uri

        store = tracking_uri(recipe.tracking.tracking_uri, root)
        pinned = resolve_version(ref, store).uri
        return Reasoner(f"{pinned}@{store}", resolve_model_uri(pinned, store), pinned)
    resolved = resolve_model_ref(ref)
    return Reasoner(str(Path(resolved).resolve()) if Path(resolved).exists() else resolved, resolved)


def evaluate_model(recipe: Any, ref: str | None, split: str, root: Path,
                   out: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Evaluate a model reference on ``split`` of the recipe's converted records, in a
    folder named by the pinned model, the records and the config; (folder, summary)."""
    model = resolve_reasoner(ref, recipe, root)  # a model that is not there is said first
    records = converted_records(recipe, root)
    if not read_split(records, split):
        raise ValueError(f"the {split} split of recipe {recipe.name!r} has no records ({records}); "
                         "choose another split")
    cfg = recipe.evaluation_settings().model_copy(update={"split": split})
    out = out or evaluation_folder(root, "model", {"model": model.identity, "records": records.name}, cfg)
    return out, run_evaluation(records, model.path, out, cfg, model_ref=model.label)
