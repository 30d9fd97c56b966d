"""The download and preprocess stages' configs (the source, the hub's repos and revisions; tasks
and seeded splits) and declarations. Light: loading a recipe imports no runner code."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from embodied_r.benchmarks import registry
from embodied_r.settings import operational, result_settings
from embodied_r.stage_plan import ITEMS, StageKind
from embodied_r.synthetic.config import SyntheticConfig


class _Hub(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def repo(self, benchmark: str) -> tuple[str, str]:
        """``(repo id, requested revision)``: ``<benchmark>_repo`` and ``<benchmark>_revision``."""
        if benchmark not in registry.NAMES:
            raise ValueError(f"unknown benchmark {benchmark!r}; choose from {', '.join(registry.NAMES)}")
        return getattr(self, f"{benchmark}_repo"), getattr(self, f"{benchmark}_revision")


# Per benchmark ``<name>_repo`` and ``<name>_revision`` (resolved to a commit and recorded);
# ``endpoint``: a mirror of the hub (None: huggingface_hub's default).
HubConfig = create_model(
    "HubConfig", __base__=_Hub,
    **{f"{b.name}_{field}": (str, value) for b in registry.BENCHMARKS
       for field, value in (("repo", b.repo), ("revision", b.revision))},
    endpoint=(str | None, operational(None)),
    max_workers=(int, operational(8, ge=1, description="files fetched in parallel")),
)


class DownloadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: Literal["synthetic", "local", "hub"] = "hub"
    source_dir: str | None = None  # local: folder holding UrbanVideo-Bench/, VSI-Bench/, ...
    # egoschema and mvbench: evaluation-only (the ``ood`` split).
    benchmarks: list[registry.Name] = Field(default_factory=lambda: list(registry.TRAINING_BENCHMARKS))
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    hub: HubConfig = Field(default_factory=HubConfig)  # type: ignore[valid-type]
    max_zip_bytes: int = operational(200 * 1024**3, ge=1)  # refuse archives that would expand past this

    @model_validator(mode="after")
    def _synthetic_makes_its_twins_only(self) -> "DownloadConfig":
        twins = [b.name for b in registry.BENCHMARKS if b.synthetic]
        other = [b for b in self.benchmarks if b not in twins]
        if self.source == "synthetic" and other:
            raise ValueError(f"the synthetic source makes {' and '.join(twins)} only, not "
                             f"{', '.join(other)}: drop them from download.benchmarks, or take them from a "
                             "mirror (download.source: local) or the hub")
        return self


class SplitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train: float = Field(0.75, ge=0, le=1)
    val: float = Field(0.05, ge=0, le=1)
    test: float = Field(0.20, ge=0, le=1)
    seed: int = 0
    folds: int = Field(5, ge=1)
    # "per_benchmark": each benchmark's scenes cut by question count; "pooled_scenes": the
    # official rule, every scene in one pool cut by scene count.
    rule: Literal["per_benchmark", "pooled_scenes"] = "per_benchmark"

    @model_validator(mode="after")
    def _sums_to_one(self) -> "SplitConfig":
        if abs(self.train + self.val + self.test - 1.0) > 1e-6:
            raise ValueError(f"split fractions must sum to 1, got {self.train}+{self.val}+{self.test}")
        return self


class CatalogConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # "paper": each benchmark's ``tasks``; "all"; or task names.
    tasks: Literal["paper", "all"] | list[str] = "paper"
    split: SplitConfig = Field(default_factory=SplitConfig)
    max_questions_per_task: int | None = Field(None, ge=1)  # a cap for small runs; None keeps all


def _download(recipe: Any, builder: Any, kind: StageKind) -> None:
    builder.add(kind, kind.name, recipe.download.model_dump(mode="json"), keyed=result_settings(recipe.download),
                inputs={"sources_root": str(builder.root / "sources")})


DOWNLOAD = StageKind("download", "embodied_r.data.download:run_stage", "cpu",
                     "download the benchmarks (or make the synthetic one)", section="download", config=DownloadConfig,
                     expand=_download, retries=2, retry_delay_s=10, unit="files",
                     extra_key="embodied_r.data.download:fingerprint", figures=ITEMS)
PREPROCESS = StageKind("preprocess", "embodied_r.data.catalog:run_stage", "cpu", "build the questions catalog with splits",
                       section="catalog", config=CatalogConfig, inputs={"raw": "download"}, figures=ITEMS)
