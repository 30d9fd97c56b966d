"""Key frames cached by video content, output parameters and code: an entry
(``<sha256 of the video>-<hash of the rest>/``) is renamed into place once complete, and stage
folders hard-link its JPEGs, so the cache can be pruned at any time. Failures are not cached."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import cv2

from embodied_r.io import payload_key, read_json, sha256_file, write_json_atomic
from embodied_r.keyframes.extract import extract_keyframes
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.video import KeyframeResult
from embodied_r.paths import home
from embodied_r.errors import VideoError

ENTRY_FILE = "entry.json"


def cache_root(cfg: KeyframeConfig) -> Path:
    return Path(cfg.cache_dir).expanduser().resolve() if cfg.cache_dir else home() / "cache" / "keyframes"


@lru_cache(maxsize=1)
def _code_version() -> str:
    h = hashlib.sha256(cv2.__version__.encode())
    for module in ("extract", "official", "video"):
        h.update((Path(__file__).parent / f"{module}.py").read_bytes())
    return h.hexdigest()


def params_hash(cfg: KeyframeConfig) -> str:
    return payload_key({"params": cfg.output_params(), "code": _code_version()})


@dataclass
class CachedKeyframes:
    folder: Path  # the entry: JPEGs plus entry.json
    meta: dict[str, Any]  # entry.json: figures of the extraction and one record per kept frame
    hit: bool
    hash_seconds: float
    extract_seconds: float  # 0 on a hit


def write_entry(folder: Path, res: KeyframeResult, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    frames = []
    for rank, (idx, ts, ov, reason, jpg) in enumerate(
            zip(res.indices, res.timestamps, res.overlaps, res.reasons, res.images or [])):
        name = f"{rank:03d}_{idx:06d}.jpg"
        (folder / name).write_bytes(jpg)
        frames.append({"rank": rank, "frame_index": idx, "timestamp": ts, "overlap": ov, "reason": reason,
                       "file": name})
    meta = {**(extra or {}), "fps": res.fps, "n_frames": res.n_frames, "width": res.width, "height": res.height,
            "sample_step": res.sample_step, "n_samples": res.n_samples, "passes": res.passes,
            "extract_seconds": round(res.seconds, 4), "frames": frames}
    write_json_atomic(folder / ENTRY_FILE, meta)
    return meta


def cached_keyframes(video_path: str | Path, cfg: KeyframeConfig, root: Path) -> CachedKeyframes:
    """From the cache, extracting and caching them on a miss; ``VideoError`` for a video that
    cannot be used."""
    path = Path(video_path)
    if not path.is_file():
        raise VideoError("missing", path, "no such file")
    start = time.perf_counter()
    digest = sha256_file(path)
    hash_seconds = time.perf_counter() - start
    entry = Path(root) / f"{digest}-{params_hash(cfg)}"
    if (entry / ENTRY_FILE).is_file():
        return CachedKeyframes(entry, read_json(entry / ENTRY_FILE), True, hash_seconds, 0.0)
    if entry.exists():
        _discard(entry)  # damaged (files deleted by hand): it would block the rename below
    res = extract_keyframes(path, cfg)
    tmp = entry.with_name(f".{entry.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        meta = write_entry(tmp, res, {"video_sha256": digest, "params": cfg.output_params()})
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / ENTRY_FILE).is_file():
                raise
            # Another process filled the same entry first; theirs is equivalent.
            meta = read_json(entry / ENTRY_FILE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return CachedKeyframes(entry, meta, False, hash_seconds, res.seconds)


def _discard(folder: Path) -> None:
    aside = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.old")
    try:
        folder.rename(aside)
    except OSError:
        return  # already gone
    shutil.rmtree(aside, ignore_errors=True)


def link_files(src_folder: Path, names: list[str], dst_folder: Path) -> None:
    """Hard links into a fresh ``dst_folder`` (copies across filesystems)."""
    shutil.rmtree(dst_folder, ignore_errors=True)  # leftovers of an attempt killed mid-video
    dst_folder.mkdir(parents=True)
    for name in names:
        try:
            os.link(src_folder / name, dst_folder / name)
        except OSError:
            shutil.copy2(src_folder / name, dst_folder / name)
