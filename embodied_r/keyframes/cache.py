"""Key frames cached by video content and key-frame parameters.

A video's key frames depend only on its bytes, on the parameters that pick and save frames
(``KeyframeConfig.output_params``) and on the code and OpenCV build that ran. An entry lives in
``<cache root>/<sha256 of the video file>-<hash of the rest>/``, holding the JPEGs and
``entry.json`` (one record per kept frame, plus the extraction figures). So a later stage run
with another recipe or another catalog that meets the same video with the same parameters
reuses the frames instead of decoding the video again, whatever the file is called or where it
lies.

An entry is filled in a temporary folder beside it and renamed into place, so an entry that
exists is complete, and two processes filling the same entry at once both succeed with one
result kept. Stage folders get hard links to the entry's JPEGs (copies across filesystems), so
the cache can be pruned at any time without harming finished stages. Failures are not cached:
a video that could not be read is tried again on the next run.

The video is hashed in 1 MiB blocks (memory does not grow with its size); the time spent is
reported beside the extraction time in the stage summary.
"""

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
from embodied_r.keyframes.extract import KeyframeResult, extract_keyframes
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.paths import home
from embodied_r.errors import VideoError

ENTRY_FILE = "entry.json"


def cache_root(cfg: KeyframeConfig) -> Path:
    return Path(cfg.cache_dir).expanduser().resolve() if cfg.cache_dir else home() / "cache" / "keyframes"


@lru_cache(maxsize=1)
def _code_version() -> str:
    # The modules that decide which frames are kept and how they are encoded.
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
    """Write one video's key frames (JPEGs and ``entry.json``) into ``folder``."""
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
    """The key frames of a video from the cache, extracting and caching them on a miss.

    Raises ``VideoError`` for a video that cannot be used (nothing is cached then).
    """
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
    """Hard-link ``names`` from ``src_folder`` into a fresh ``dst_folder`` (copy across filesystems)."""
    shutil.rmtree(dst_folder, ignore_errors=True)  # leftovers of an attempt killed mid-video
    dst_folder.mkdir(parents=True)
    for name in names:
        try:
            os.link(src_folder / name, dst_folder / name)
        except OSError:
            shutil.copy2(src_folder / name, dst_folder / name)
