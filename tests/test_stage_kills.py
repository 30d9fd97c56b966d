"""Download, catalog and convert killed for real (SIGKILL to the process group) in the middle
of their work: the rerun ends with exactly the files an uninterrupted run writes, and leaves
no ``.partial`` folder, temporary file or held lock behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from embodied_r import benchmark_rules as bm
from embodied_r.data.catalog import CatalogConfig, run_catalog
from embodied_r.data.download import DownloadConfig, run_download
from embodied_r.io import OUTPUTS_KEY, partial_path
from embodied_r.training.records import RecordsConfig, run_records
from tests.killing import assert_clean_finish, files, kill_at_item, lock_is_free
from tests.test_download_catalog import _mirror
from tests.test_records import VIDEO, catalog_row, write_inputs

# Timings differ from run to run; everything else in a summary must not.
TIMINGS = ("seconds", "hash_seconds")


def summary(folder: Path, per_run: tuple[str, ...] = ()) -> dict[str, Any]:
    # The sizes the summary records (``io.OUTPUTS_KEY``) include the volatile files': the files
    # themselves are compared by ``assert_same_output``.
    return {k: v for k, v in json.loads((folder / "summary.json").read_text()).items()
            if k not in TIMINGS + per_run + (OUTPUTS_KEY,)}


def assert_same_output(resumed: Path, whole: Path, volatile: tuple[str, ...] = ("summary.json",),
                       per_run: tuple[str, ...] = ()) -> None:
    assert_clean_finish(resumed)
    assert files(resumed, volatile) == files(whole, volatile)
    assert summary(resumed, per_run) == summary(whole, per_run)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mirror(tmp_path_factory.mktemp("mirror"))


@pytest.fixture(scope="module")
def raw(mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("raw") / "raw"
    run_download(out, DownloadConfig(source="local", source_dir=str(mirror)), out.parent / "sources")
    return out


# The mirror's items: 12 UrbanVideo clips and MCQ.parquet, then VSI-Bench's Parquet file and
# its zip (15 files linked), then the zip's 4 videos extracted (items 16 to 19).
@pytest.mark.parametrize("n, linked, extracted", [(6, 6, 0), (17, 15, 2)])
def test_killed_download_resumes_to_the_uninterrupted_result(mirror: Path, raw: Path, tmp_path: Path,
                                                             n: int, linked: int, extracted: int) -> None:
    cfg = DownloadConfig(source="local", source_dir=str(mirror))
    out = tmp_path / "raw"
    code = (
        "from pathlib import Path\n"
        "from embodied_r.data.download import DownloadConfig, run_download\n"
        f"run_download(Path({str(out)!r}), DownloadConfig.model_validate_json({cfg.model_dump_json()!r}),\n"
        f"             Path({str(tmp_path / 'sources')!r}))\n"
    )
    kill_at_item(code, "download", n, tmp_path)
    work = partial_path(out)
    assert not out.exists() and work.is_dir()
    brought = [p for p in work.rglob("*") if p.is_file()]
    videos = work / bm.VSIBENCH_DIR / "videos"
    assert len(brought) == linked + extracted
    assert len(list(videos.rglob("*.mp4")) if videos.exists() else []) == extracted
    assert lock_is_free(out)

    resumed = run_download(out, cfg, tmp_path / "sources")
    assert_same_output(out, raw, per_run=("extracted",))
    # "extracted" counts this run's work: the rerun extracted only what the killed run had not.
    assert resumed["extracted"] == 4 - extracted


@pytest.mark.parametrize("n", [1, 3])  # after catalog.parquet; after the DuckDB file, before the summary
def test_killed_catalog_resumes_to_the_uninterrupted_result(raw: Path, tmp_path: Path, n: int) -> None:
    cfg = CatalogConfig(tasks="all")
    whole = tmp_path / "whole"
    run_catalog(raw, whole, cfg)
    out = tmp_path / "catalog"
    code = (
        "from pathlib import Path\n"
        "from embodied_r.data.catalog import CatalogConfig, run_catalog\n"
        f"run_catalog(Path({str(raw)!r}), Path({str(out)!r}),\n"
        f"            CatalogConfig.model_validate_json({cfg.model_dump_json()!r}))\n"
    )
    kill_at_item(code, "preprocess", n, tmp_path)
    assert not out.exists() and (partial_path(out) / "catalog.parquet").is_file()
    assert (partial_path(out) / "catalog.duckdb").is_file() == (n == 3)

    run_catalog(raw, out, cfg)
    # A DuckDB file is not the same bytes twice: its tables and views are compared instead.
    assert_same_output(out, whole, volatile=("summary.json", "catalog.duckdb"))
    assert database(out / "catalog.duckdb") == database(whole / "catalog.duckdb")


def database(path: Path) -> dict[str, Any]:
    with duckdb.connect(str(path), read_only=True) as con:
        names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()]
        return {name: con.execute(f"SELECT * FROM {name} ORDER BY ALL").fetchall() for name in names}


# After train and val are written; after every table, before the summary.
@pytest.mark.parametrize("n, written", [(2, ["train.parquet", "val.parquet"]),
                                        (4, ["failures.parquet", "test.parquet", "train.parquet", "val.parquet"])])
def test_killed_convert_resumes_to_the_uninterrupted_result(tmp_path: Path, n: int, written: list[str]) -> None:
    rows = [catalog_row(f"urbanvideo:{i}", split=("train", "train", "val", "test")[i % 4]) for i in range(12)]
    texts = {r["uid"]: VIDEO for r in rows[:-1]}  # the last question has no perception text: a failure
    catalog, perception = write_inputs(tmp_path, rows, texts)
    whole = tmp_path / "whole"
    run_records(catalog, perception, whole, RecordsConfig())
    out = tmp_path / "records"
    code = (
        "from pathlib import Path\n"
        "from embodied_r.training.records import RecordsConfig, run_records\n"
        f"run_records(Path({str(catalog)!r}), Path({str(perception)!r}), Path({str(out)!r}), RecordsConfig())\n"
    )
    kill_at_item(code, "convert", n, tmp_path)
    assert sorted(p.name for p in partial_path(out).iterdir()) == written

    run_records(catalog, perception, out, RecordsConfig())
    assert_same_output(out, whole)
    assert summary(out)["failed"] == 1 and summary(out)["done"] == 11
