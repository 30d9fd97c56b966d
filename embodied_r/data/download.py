"""Download stage: a benchmark's needed files into a stage folder (from the synthetic benchmark,
a local mirror laid out like the hub repos, or the hub), never touching the source; a manifest
of their origin, sizes and sha256; the video archives extracted safely."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from embodied_r import code_keys
from embodied_r.benchmarks import registry
from embodied_r.benchmarks.base import Benchmark
from embodied_r.data import hub as download_hub
from embodied_r.data.config import DownloadConfig
from embodied_r.errors import DataSourceError
from embodied_r.io import (is_complete, item_done, read_summary, safe_extract, sha256_file, stage_folder,
                           write_json_atomic, write_summary)
from embodied_r.settings import result_settings
from embodied_r.synthetic.generate import make_synthetic_benchmark
from embodied_r.synthetic.truth import FACTS_FILE, TRUTH_FILE


def _needed(root: Path, benchmark: str) -> list[str]:
    base = root / registry.get(benchmark).folder
    names = [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()] if base.is_dir() else []
    return download_hub.needed_files(names, benchmark)


def source_fingerprint(cfg: DownloadConfig) -> str:
    """The source's content for the stage's key: a local mirror's needed files' names, sizes
    and modification times (a cheap stat walk); the other sources' config."""
    if cfg.source != "local":
        return json.dumps(result_settings(cfg), sort_keys=True)
    root = _check_local(cfg)
    h = hashlib.sha256()
    for benchmark in cfg.benchmarks:
        for name in _needed(root, benchmark):
            st = (root / registry.get(benchmark).folder / name).stat()
            h.update(f"{benchmark}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _check_local(cfg: DownloadConfig) -> Path:
    if not cfg.source_dir:
        folders = " and ".join(f"{registry.get(b).folder}/" for b in cfg.benchmarks)
        raise DataSourceError("download.source is 'local' but source_dir is not set: point it at "
                              f"the folder holding {folders}")
    root = Path(cfg.source_dir).expanduser().resolve()
    for benchmark in cfg.benchmarks:
        sub, name = registry.get(benchmark).folder, registry.get(benchmark).question_file
        if not (root / sub / name).is_file():
            raise DataSourceError(
                f"{root / sub / name} not found: a local source must be laid out like the hub repos "
                f"({sub}/{name}); fix download.source_dir (--source) or drop the benchmark from "
                "download.benchmarks"
            )
    return root


def _mirror_revision(root: Path, benchmark: str) -> str | None:
    """The commit ``hf download --local-dir`` noted beside the files; None otherwise."""
    b = registry.get(benchmark)
    note = root / b.folder / ".cache" / "huggingface" / "download" / f"{b.question_file}.metadata"
    try:
        first = note.read_text(encoding="utf-8").splitlines()[0].strip()
    except (OSError, IndexError):
        return None
    return first if len(first) == 40 and all(c in "0123456789abcdef" for c in first) else None


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() and dst.stat().st_size == src.stat().st_size:
        return
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        # Later stages only read these files, so the shared inode never sees a write.
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def _from_folder(root: Path, cfg: DownloadConfig, work: Path) -> dict[str, dict]:
    origin: dict[str, dict] = {}
    for benchmark in cfg.benchmarks:
        sub = registry.get(benchmark).folder
        for name in _needed(root, benchmark):
            _link_or_copy(root / sub / name, work / sub / name)
            item_done("download")
        # The synthetic benchmark's truth (for the demo's perceiver) and facts (for the traces).
        for extra in (TRUTH_FILE, FACTS_FILE):
            if (root / sub / extra).is_file():
                _link_or_copy(root / sub / extra, work / sub / extra)
        repo, _ = cfg.hub.repo(benchmark)
        origin[benchmark] = {"repo": repo, "requested_revision": None, "revision": _mirror_revision(root, benchmark),
                             "allow_patterns": registry.get(benchmark).allow_patterns, "source_dir": str(root)}
    return origin


def generator_version() -> str:
    """A hash of the synthetic generator's code and the benchmark layouts it writes."""
    modules = code_keys.closure(make_synthetic_benchmark.__module__, frozenset({"synthetic"}))
    return code_keys.modules_version([m for m in modules if m.startswith(("embodied_r.synthetic", "embodied_r.benchmarks"))])


def _synthetic_root(cfg: DownloadConfig, sources_root: Path) -> Path:
    """Made once per config and generator code, so an older generator's is never taken."""
    key = hashlib.sha256((cfg.synthetic.model_dump_json() + generator_version()).encode()).hexdigest()[:12]
    root = Path(sources_root) / f"synthetic-{key}"
    if not (root / ".complete").exists():
        make_synthetic_benchmark(root, cfg.synthetic)
        (root / ".complete").touch()
    return root


def run_download(out: Path, cfg: DownloadConfig, sources_root: Path) -> dict:
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    start = time.time()
    with stage_folder(out) as work:
        if cfg.source == "hub":
            origin = download_hub.fetch(cfg.hub, cfg.benchmarks, work)
        else:
            root = _synthetic_root(cfg, sources_root) if cfg.source == "synthetic" else _check_local(cfg)
            origin = _from_folder(root, cfg, work)
        hash_start = time.time()
        files: dict[str, dict] = {}
        for benchmark in cfg.benchmarks:
            sub = registry.get(benchmark).folder
            for name in _needed(work, benchmark):
                path = work / sub / name
                files[f"{sub}/{name}"] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
            if cfg.source == "hub":
                download_hub.verify(work, benchmark, origin[benchmark].pop("expected"), files)
            mine = [f for k, f in files.items() if k.startswith(sub + "/")]
            origin[benchmark].update(files=len(mine), bytes=sum(f["size"] for f in mine))
        hash_seconds = time.time() - hash_start
        extracted = sum(_extract_videos(work, registry.get(b), cfg.max_zip_bytes) for b in cfg.benchmarks)
        write_json_atomic(work / "manifest.json", {"source": cfg.source, "benchmarks": origin, "files": files})
        summary = {"source": cfg.source, "files": len(files), "bytes": sum(f["size"] for f in files.values()),
                   "videos": sum(1 for _ in work.rglob("*.mp4")), "extracted": extracted,
                   "revisions": {b: o["revision"] or "" for b, o in origin.items()},
                   "hash_seconds": round(hash_seconds, 3), "seconds": round(time.time() - start, 3)}
        write_summary(work, summary)
    return summary


def _extract_videos(work: Path, benchmark: Benchmark, max_bytes: int) -> int:
    """Into its ``videos/``; only the videos its questions use (EgoSchema's five archives hold
    5,031 clips for 500 questions)."""
    base = work / benchmark.folder
    names = benchmark.videos(base) if benchmark.videos else None
    extracted = 0
    for pattern, sub in benchmark.archives.items():
        for archive in sorted(base.glob(pattern)):
            extracted += safe_extract(archive, base / "videos" / sub, max_bytes,
                                      names=None if names is None else names.get(pattern, set()))
    return extracted


def fingerprint(config: dict[str, Any]) -> str:
    return source_fingerprint(DownloadConfig.model_validate(config))


def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    return run_download(out, DownloadConfig.model_validate(config), Path(inputs["sources_root"]))
