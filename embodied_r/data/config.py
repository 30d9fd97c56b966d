"""The download and preprocess stages' configs and declarations."""

from __future__ import annotations

from typing import Any

from embodied_r.data.catalog import CatalogConfig
from embodied_r.data.download import DownloadConfig
from embodied_r.settings import result_settings
from embodied_r.stage_plan import ITEMS, StageKind


def _download(recipe: Any, builder: Any, kind: StageKind) -> None:
    builder.add(kind, kind.name, recipe.download.model_dump(mode="json"), keyed=result_settings(recipe.download),
                inputs={"sources_root": str(builder.root / "sources")})


DOWNLOAD = StageKind("download", "embodied_r.data.download:run_stage", "cpu",
                     "download the benchmarks (or make the synthetic one)", section="download", config=DownloadConfig,
                     expand=_download, retries=2, retry_delay_s=10, unit="files",
                     extra_key="embodied_r.data.download:fingerprint", figures=ITEMS)
PREPROCESS = StageKind("preprocess", "embodied_r.data.catalog:run_stage", "cpu", "build the questions catalog with splits",
                       section="catalog", config=CatalogConfig, inputs={"raw": "download"}, figures=ITEMS)
