"""The stage graph: what each stage reads, where it writes, and its cache key.

A stage's key hashes its own config, the keys of the stages it reads and the source of
the library modules it runs, so editing a stage's config or code recomputes that stage
and everything after it, and nothing before. ``plan`` is pure; ``execute`` runs one stage.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from embodied_r.config import Recipe
from embodied_r.io import is_complete
from embodied_r.paths import home as default_home

# Library modules whose source is part of each stage kind's cache key.
_COMMON = ["io", "schemas"]
STAGE_MODULES: dict[str, list[str]] = {
    "download": ["download", "download_hub", "synthetic", "synthetic_world", "synthetic_urban",
                 "synthetic_vsi", "benchmarks"],
    "preprocess": ["catalog", "benchmarks"],
    "keyframes": ["keyframes", "keyframes_stage", "keyframes_cache", "video"],
    "perception": ["perception", "perception_modes", "perception_parse", "prompts", "backends",
                   "backend_transformers", "backend_openai", "backend_vllm", "tiny_models"],
    "convert": ["records", "answers"],
    "train": ["training", "train_grpo", "rewards", "answers", "backends", "backend_transformers",
              "backend_openai", "backend_vllm", "tiny_models"],
    "evaluate": ["evaluation", "metrics", "answers", "rewards", "report", "registry", "benchmarks",
                 "backends", "backend_transformers", "backend_openai", "backend_vllm", "tiny_models"],
}


class StageError(ValueError):
    """An unknown stage, or a stage asked for before the stages it reads from."""


@dataclass(frozen=True)
class StagePlan:
    name: str  # "download", ..., "train_stage1", ..., "evaluate"
    kind: str  # key of STAGE_MODULES
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


@lru_cache(maxsize=None)
def module_version(module: str) -> str:
    spec = importlib.util.find_spec(f"embodied_r.{module}")
    if spec is None or not spec.origin:
        return "absent"
    return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()


def code_version(kind: str) -> str:
    h = hashlib.sha256()
    for module in sorted(STAGE_MODULES[kind] + _COMMON):
        h.update(f"{module}={module_version(module)}\n".encode())
    return h.hexdigest()


def _key(kind: str, config: dict[str, Any], upstream: list[str], extra: str = "") -> str:
    payload = json.dumps(
        {"kind": kind, "config": config, "upstream": upstream, "code": code_version(kind), "extra": extra},
        sort_keys=True, default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def plan(recipe: Recipe, root: Path | None = None) -> dict[str, StagePlan]:
    """Every stage of the pipeline in run order."""
    from embodied_r.download import source_fingerprint

    root = Path(root) if root else default_home()
    stages: dict[str, StagePlan] = {}

    def add(name: str, kind: str, deps: list[str], config: dict[str, Any],
            inputs: dict[str, str], extra: str = "") -> StagePlan:
        key = _key(kind, config, [stages[d].key for d in deps], extra)
        sp = StagePlan(name=name, kind=kind, key=key, out=str(root / "stages" / name / key),
                       deps=tuple(deps), inputs=inputs, config=config)
        stages[name] = sp
        return sp

    dl = add("download", "download", [], recipe.download.model_dump(mode="json"),
             {"sources_root": str(root / "sources")}, extra=source_fingerprint(recipe.download))
    cat = add("preprocess", "preprocess", ["download"], recipe.catalog.model_dump(mode="json"),
              {"raw": dl.out})
    catalog_file = str(Path(cat.out) / "catalog.parquet")
    kf = add("keyframes", "keyframes", ["preprocess"], recipe.keyframes.model_dump(mode="json"),
             {"catalog": catalog_file})
    per = add("perception", "perception", ["preprocess", "keyframes"],
              recipe.perception.model_dump(mode="json"), {"catalog": catalog_file, "keyframes": kf.out})
    conv = add("convert", "convert", ["preprocess", "perception"], recipe.records.model_dump(mode="json"),
               {"catalog": catalog_file, "perception": per.out})
    # Which interpreter runs the trainer is where, not what: moving it must not retrain.
    training = recipe.training.model_dump(mode="json", exclude={"stages", "python"})
    model = recipe.training.policy
    prev: list[str] = []
    for stage in recipe.training.stages:
        sp = add(f"train_{stage.name}", "train", ["convert", *prev],
                 {"stage": stage.model_dump(mode="json"), "training": training},
                 {"records": conv.out, "init_model": model, "python": recipe.training.python or ""})
        model = str(Path(sp.out) / "model")
        prev = [sp.name]
    add("evaluate", "evaluate", ["convert", *prev], recipe.evaluation.model_dump(mode="json"),
        {"records": conv.out, "model": model})
    return stages


def downstream(stages: dict[str, StagePlan], name: str) -> list[str]:
    """``name`` and every stage that reads from it, directly or not, in run order."""
    if name not in stages:
        raise StageError(f"unknown stage {name!r}; stages are {', '.join(stages)}")
    hit = {name}
    for sp in stages.values():
        if any(d in hit for d in sp.deps):
            hit.add(sp.name)
    return [s for s in stages if s in hit]


def resolve_stage_name(stages: dict[str, StagePlan], name: str) -> str:
    """Accept a stage's name or its kind ("train" means the first training stage)."""
    if name in stages:
        return name
    for sp in stages.values():
        if sp.kind == name:
            return sp.name
    raise StageError(f"unknown stage {name!r}; stages are {', '.join(stages)}")


def select_stages(stages: dict[str, StagePlan], only: list[str] | None, recipe_name: str) -> list[str]:
    """The stages to run, checking that each one's inputs exist or are run too."""
    selected = [resolve_stage_name(stages, s) for s in only] if only else list(stages)
    for name in selected:
        missing = [d for d in stages[name].deps if d not in selected and not stages[d].complete]
        if missing:
            raise StageError(
                f"stage {name!r} reads the output of {', '.join(missing)}, which has not been run "
                f"with this recipe: run `embodied-r {stages[missing[0]].kind} --recipe {recipe_name}` "
                f"first, or the whole pipeline with `embodied-r run --recipe {recipe_name}`"
            )
    return selected


def training_stage_names(stages: dict[str, StagePlan]) -> list[str]:
    return [n for n, sp in stages.items() if sp.kind == "train"]


def execute(sp: StagePlan, mlflow_run_id: str | None = None) -> dict[str, Any]:
    """Run one stage (a no-op returning its summary when its folder is complete)."""
    out = Path(sp.out)
    cfg = sp.config
    if sp.kind == "download":
        from embodied_r.download import DownloadConfig, run_download

        return run_download(out, DownloadConfig.model_validate(cfg), Path(sp.inputs["sources_root"]))
    if sp.kind == "preprocess":
        from embodied_r.catalog import CatalogConfig, run_catalog

        return run_catalog(Path(sp.inputs["raw"]), out, CatalogConfig.model_validate(cfg))
    if sp.kind == "keyframes":
        from embodied_r.keyframes import KeyframeConfig, run_keyframes

        return run_keyframes(Path(sp.inputs["catalog"]), out, KeyframeConfig.model_validate(cfg))
    if sp.kind == "perception":
        from embodied_r.perception import PerceptionConfig, run_perception

        return run_perception(Path(sp.inputs["catalog"]), Path(sp.inputs["keyframes"]), out,
                              PerceptionConfig.model_validate(cfg))
    if sp.kind == "convert":
        from embodied_r.records import RecordsConfig, run_records

        return run_records(Path(sp.inputs["catalog"]), Path(sp.inputs["perception"]), out,
                           RecordsConfig.model_validate(cfg))
    if sp.kind == "train":
        from embodied_r.training import GRPOStageConfig, TrainingConfig, run_training_stage

        training = TrainingConfig.model_validate({**cfg["training"], "stages": [cfg["stage"]],
                                                  "python": sp.inputs.get("python") or None})
        return run_training_stage(Path(sp.inputs["records"]), sp.inputs["init_model"], out,
                                  GRPOStageConfig.model_validate(cfg["stage"]), training,
                                  mlflow_run_id=mlflow_run_id)
    if sp.kind == "evaluate":
        from embodied_r.evaluation import EvaluationConfig, run_evaluation

        return run_evaluation(Path(sp.inputs["records"]), sp.inputs["model"], out,
                              EvaluationConfig.model_validate(cfg))
    raise ValueError(f"unknown stage kind {sp.kind!r}")
