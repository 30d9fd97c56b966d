"""Stage inputs built on the spot: a catalog with perception texts, the GRPO records made from
them, and a raw folder downloaded from a local mirror."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from embodied_r import schemas
from embodied_r.io import table_from_records, write_parquet_atomic

OPTIONS = ["A. left", "B. right", "C. ahead", "D. behind"]

VIDEO = "Frame 0: Observe: a street.\nFrame 1: After move forward, Observe: a red door ahead."


def catalog_row(uid: str, split: str = "train", answer: str = "C", answer_type: str = "choice",
                category: str = "Landmark Position", benchmark: str = "urbanvideo") -> dict[str, Any]:
    return {
        "uid": uid, "benchmark": benchmark, "original_id": uid.split(":")[-1], "video_id": "v1",
        "video_path": "/data/v1.mp4", "scene": "s1", "category": category,
        "question": f"Where is the red door? ({uid})",
        "options": OPTIONS if answer_type == "choice" else [],
        "answer": answer, "answer_type": answer_type, "split": split, "fold": 0,
    }


def write_inputs(tmp: Path, rows: list[dict[str, Any]], texts: dict[str, str]) -> tuple[Path, Path]:
    catalog = tmp / "catalog" / "catalog.parquet"
    write_parquet_atomic(table_from_records(rows, schemas.CATALOG), catalog)
    perception = tmp / "perception"
    prows = [{"uid": u, "video_text": t, "n_frames": 2, "n_calls": 2, "prompt_tokens": 10, "completion_tokens": 5}
             for u, t in texts.items()]
    write_parquet_atomic(table_from_records(prows, schemas.PERCEPTION), perception / "perception.parquet")
    return catalog, perception


def build_records(tmp: Path, rows: list[dict[str, Any]], texts: dict[str, str] | None = None,
                  out: Path | None = None) -> Path:
    """The records stage's folder (``out``, by default ``tmp / "records"``) for ``rows``, each
    question's perception text from ``texts`` (by default ``VIDEO``)."""
    from embodied_r.training.records import run_records
    from embodied_r.training.records_config import RecordsConfig

    out = out or tmp / "records"
    catalog, perception = write_inputs(tmp, rows, texts if texts is not None else {r["uid"]: VIDEO for r in rows})
    run_records(catalog, perception, out, RecordsConfig())
    return out


def download_raw(mirror: Path, tmp_path_factory: pytest.TempPathFactory, benchmarks: list[str] | None = None,
                 sources: Path | None = None) -> Path:
    """The download stage's folder from the local ``mirror``: all its benchmarks, or ``benchmarks``."""
    from embodied_r.data.config import DownloadConfig
    from embodied_r.data.download import run_download

    out = tmp_path_factory.mktemp("stages") / "raw"
    chosen = {"benchmarks": benchmarks} if benchmarks is not None else {}
    run_download(out, DownloadConfig(source="local", source_dir=str(mirror), **chosen),
                 sources or tmp_path_factory.mktemp("sources"))
    return out
