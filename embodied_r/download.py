"""Download stage: bring the benchmark files into a stage folder, never touching the source.

Sources: ``synthetic`` (a small benchmark generated on the spot in the real layouts),
``local`` (an offline mirror laid out like the hub repos) and ``hub`` (Hugging Face Hub,
pinned revisions). VSI-Bench's video zips are extracted here, safely.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import zipfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from embodied_r import benchmarks as bm
from embodied_r.io import is_complete, read_summary, stage_folder, write_json_atomic, write_summary
from embodied_r.synthetic import SyntheticConfig, make_synthetic_benchmark


class HubConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    urbanvideo_repo: str = "EmbodiedCity/UrbanVideo-Bench"
    urbanvideo_revision: str = "main"
    vsibench_repo: str = "nyu-visionx/VSI-Bench"
    vsibench_revision: str = "main"


class DownloadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: Literal["synthetic", "local", "hub"] = "hub"
    source_dir: str | None = None  # local: folder holding UrbanVideo-Bench/ and VSI-Bench/
    benchmarks: list[Literal["urbanvideo", "vsibench"]] = Field(
        default_factory=lambda: ["urbanvideo", "vsibench"]
    )
    synthetic: SyntheticConfig = Field(default_factory=SyntheticConfig)
    hub: HubConfig = Field(default_factory=HubConfig)
    max_zip_bytes: int = 200 * 1024**3  # refuse archives that would expand past this


class DataSourceError(ValueError):
    """A dataset source that is missing or malformed; the message names the fix."""


def _dirs(benchmarks: list[str]) -> list[str]:
    return [bm.URBANVIDEO_DIR if b == bm.URBANVIDEO else bm.VSIBENCH_DIR for b in benchmarks]


def source_fingerprint(cfg: DownloadConfig) -> str:
    """What identifies the source's content, for the stage's cache key.

    A local mirror is fingerprinted by names, sizes and modification times (a stat walk,
    cheap even for large mirrors); synthetic and hub sources by their config.
    """
    if cfg.source != "local":
        return cfg.model_dump_json()
    root = _check_local(cfg)
    h = hashlib.sha256()
    for sub in _dirs(cfg.benchmarks):
        for path in sorted((root / sub).rglob("*")):
            if path.is_file():
                st = path.stat()
                h.update(f"{path.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _check_local(cfg: DownloadConfig) -> Path:
    if not cfg.source_dir:
        raise DataSourceError("data.download.source is 'local' but source_dir is not set: point it at "
                              "the folder holding UrbanVideo-Bench/ and VSI-Bench/")
    root = Path(cfg.source_dir).expanduser().resolve()
    expected = {bm.URBANVIDEO_DIR: bm.URBANVIDEO_FILE, bm.VSIBENCH_DIR: bm.VSIBENCH_FILE}
    for sub in _dirs(cfg.benchmarks):
        if not (root / sub / expected[sub]).is_file():
            raise DataSourceError(
                f"{root / sub / expected[sub]} not found: a local source must be laid out like the "
                f"hub repos ({sub}/{expected[sub]}); fix data.download.source_dir or drop the "
                f"benchmark from data.download.benchmarks"
            )
    return root


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() and dst.stat().st_size == src.stat().st_size:
        return
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)  # no second copy of the videos when on the same filesystem
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def safe_extract(archive: Path, dest: Path, max_bytes: int) -> int:
    """Extract a zip, refusing absolute paths, ``..``, links and oversized expansion.

    Idempotent: an entry already present with the right size is skipped. Returns the
    number of files written.
    """
    dest = dest.resolve()
    written = 0
    with zipfile.ZipFile(archive) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        total = sum(i.file_size for i in infos)
        if total > max_bytes:
            raise DataSourceError(f"{archive}: expands to {total} bytes, over the bound {max_bytes}")
        for info in infos:
            name = info.filename
            mode = (info.external_attr >> 16) & 0o170000
            if mode == 0o120000:
                raise DataSourceError(f"{archive}: entry {name!r} is a link; refusing to extract")
            target = (dest / name).resolve()
            if Path(name).is_absolute() or ".." in Path(name).parts or dest not in target.parents:
                raise DataSourceError(f"{archive}: entry {name!r} escapes the target folder")
            if target.exists() and target.stat().st_size == info.file_size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            with zf.open(info) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, target)
            written += 1
    return written


def _hub_fetch(cfg: DownloadConfig, work: Path) -> None:  # pragma: no cover - needs the network
    from huggingface_hub import snapshot_download

    if bm.URBANVIDEO in cfg.benchmarks:
        snapshot_download(
            cfg.hub.urbanvideo_repo, repo_type="dataset", revision=cfg.hub.urbanvideo_revision,
            allow_patterns=[bm.URBANVIDEO_FILE, "videos/*"], local_dir=work / bm.URBANVIDEO_DIR,
        )
    if bm.VSIBENCH in cfg.benchmarks:
        snapshot_download(
            cfg.hub.vsibench_repo, repo_type="dataset", revision=cfg.hub.vsibench_revision,
            allow_patterns=[bm.VSIBENCH_FILE, *bm.VSIBENCH_ZIPS], local_dir=work / bm.VSIBENCH_DIR,
        )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run_download(out: Path, cfg: DownloadConfig, sources_root: Path) -> dict:
    """Fill ``out`` with ``UrbanVideo-Bench/`` and ``VSI-Bench/`` (videos extracted)."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    start = time.time()
    with stage_folder(out) as work:
        if cfg.source == "hub":
            _hub_fetch(cfg, work)
            root = work
        else:
            if cfg.source == "synthetic":
                root = Path(sources_root) / ("synthetic-" + hashlib.sha256(
                    cfg.synthetic.model_dump_json().encode()).hexdigest()[:12])
                if not (root / ".complete").exists():
                    make_synthetic_benchmark(root, cfg.synthetic)
                    (root / ".complete").touch()
            else:
                root = _check_local(cfg)
            for sub in _dirs(cfg.benchmarks):
                for src in sorted((root / sub).rglob("*")):
                    if src.is_file() and not src.name.startswith("."):
                        _link_or_copy(src, work / sub / src.relative_to(root / sub))
        extracted = 0
        if bm.VSIBENCH in cfg.benchmarks:
            for name in bm.VSIBENCH_ZIPS:
                archive = work / bm.VSIBENCH_DIR / name
                if archive.exists():
                    extracted += safe_extract(archive, work / bm.VSIBENCH_DIR / "videos", cfg.max_zip_bytes)
        manifest = {
            str(p.relative_to(work)): {"size": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(work.rglob("*"))
            if p.is_file() and p.suffix in {".parquet", ".zip"}
        }
        write_json_atomic(work / "manifest.json", {"source": cfg.source, "files": manifest})
        videos = sum(1 for p in work.rglob("*.mp4"))
        summary = {
            "source": cfg.source,
            "files": len(manifest),
            "videos": videos,
            "extracted": extracted,
            "seconds": round(time.time() - start, 3),
        }
        write_summary(work, summary)
    return summary
