"""The key-frame stage: key frames of every distinct video of a catalog in a process pool,
each video logged as it completes (a killed run resumes at the next); a video that cannot be
used fails alone. Writes ``keyframes.parquet``, ``failures.parquet``, the JPEGs and a montage."""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import shutil
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from hashlib import sha1
from pathlib import Path
from typing import Any, Iterator, Sequence

import cv2
import numpy as np
import pyarrow.parquet as pq

from embodied_r import schemas
from embodied_r import progress
from embodied_r.children import children_deaf_to_ctrl_c
from embodied_r.io import (ItemLog, is_complete, item_done, read_summary, stage_folder, table_from_records,
                           write_parquet_atomic, write_summary)
from embodied_r.keyframes.extract import extract_keyframes
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.cache import cache_root, cached_keyframes, link_files, write_entry
from embodied_r.errors import VideoError
from embodied_r.shards import SHARD_INPUT, Sharding, parse_selection, run_sharded


def safe_name(video_id: str) -> str:
    """Ids that had to change get a short hash against clashes."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", video_id).strip("._") or "video"
    return name if name == video_id else f"{name[:120]}-{sha1(video_id.encode()).hexdigest()[:8]}"


MONTAGE_VIDEOS = 3
MONTAGE_FRAMES = 6


def _caption(row: dict[str, Any]) -> str:
    overlap = row.get("overlap")
    shown = "-" if overlap is None or (isinstance(overlap, float) and math.isnan(overlap)) else f"{overlap:.2f}"
    return f"#{row['rank']} t={row['timestamp']:.1f}s overlap {shown} {row['reason']}"


def make_video_montage(videos: Sequence[tuple[str, Sequence[dict[str, Any]]]], folder: Path, out_path: Path, *,
                       frames: int = MONTAGE_FRAMES, tile_width: int = 400) -> Path:
    """One row per video, up to ``frames`` key frames spread over it, each captioned."""
    font, thick = cv2.FONT_HERSHEY_SIMPLEX, 1
    bar, title = 30, 36
    blocks = []
    for video_id, rows in videos:
        picks = [rows[round(i * (len(rows) - 1) / max(frames - 1, 1))] for i in range(min(frames, len(rows)))]
        picks = list({r["rank"]: r for r in picks}.values())
        tiles = []
        for row in picks:
            im = cv2.imread(str(Path(folder) / row["image_path"]))
            if im is None:
                continue
            th = max(1, round(tile_width * im.shape[0] / im.shape[1]))
            tile = np.full((th + bar, tile_width, 3), 255, np.uint8)
            tile[:th] = cv2.resize(im, (tile_width, th), interpolation=cv2.INTER_AREA)
            cv2.putText(tile, _caption(row), (6, th + 21), font, 0.5, (20, 20, 20), thick, cv2.LINE_AA)
            tiles.append(tile)
        if not tiles:
            continue
        height = max(t.shape[0] for t in tiles)
        strip = np.full((title + height, frames * tile_width, 3), 255, np.uint8)
        cv2.putText(strip, f"{video_id}  ({len(rows)} key frames)", (8, 26), font, 0.8, (0, 0, 0), 2, cv2.LINE_AA)
        for i, tile in enumerate(tiles):
            strip[title:title + tile.shape[0], i * tile_width:(i + 1) * tile_width] = tile
        blocks.append(strip)
    if not blocks:
        raise ValueError("no readable key frame to show")
    out = Path(out_path)
    if not cv2.imwrite(str(out), np.vstack(blocks), [cv2.IMWRITE_JPEG_QUALITY, 88]):
        raise OSError(f"cannot write {out}")
    return out


def _catalog_videos(catalog: Path) -> list[tuple[str, str]]:
    path = Path(catalog)
    if path.is_dir():
        path = path / "catalog.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"catalog {path} not found: run the preprocess stage first, or pass "
                                "the catalog Parquet file (or its folder)")
    missing = {"video_id", "video_path"} - set(pq.read_schema(path).names)
    if missing:
        raise ValueError(f"catalog {path} lacks columns {sorted(missing)}: it must follow schemas.CATALOG")
    table = pq.read_table(path, columns=["video_id", "video_path"])
    videos: dict[str, str] = {}
    for vid, vpath in zip(table.column("video_id").to_pylist(), table.column("video_path").to_pylist()):
        if vid is not None and vid not in videos:
            p = Path(vpath or "")
            videos[vid] = str(p if p.is_absolute() else path.parent / p)
    return list(videos.items())


def _process_video(video_id: str, video_path: str, work: str, cfg: KeyframeConfig, cache: str | None) -> dict:
    rel = Path("frames") / safe_name(video_id)
    folder = Path(work) / rel
    hit, hash_seconds = False, 0.0
    try:
        if cache is not None:
            got = cached_keyframes(video_path, cfg, Path(cache))
            link_files(got.folder, [f["file"] for f in got.meta["frames"]], folder)
            meta, hit, hash_seconds, seconds = got.meta, got.hit, got.hash_seconds, got.extract_seconds
        else:
            res = extract_keyframes(video_path, cfg)
            shutil.rmtree(folder, ignore_errors=True)  # leftovers of an attempt killed mid-video
            meta, seconds = write_entry(folder, res), res.seconds
    except VideoError as e:
        return {"video_id": video_id, "status": "failed", "code": e.code, "reason": str(e)}
    except cv2.error as e:
        return {"video_id": video_id, "status": "failed", "code": "opencv_error",
                "reason": f"opencv_error: {video_path}: {str(e).strip()}"}
    (folder / "entry.json").unlink(missing_ok=True)  # the stage's own index is keyframes.parquet
    rows = [{"video_id": video_id, "rank": f["rank"], "frame_index": f["frame_index"], "timestamp": f["timestamp"],
             "overlap": f["overlap"], "reason": f["reason"], "image_path": (rel / f["file"]).as_posix()}
            for f in meta["frames"]]
    return {"video_id": video_id, "status": "done", "rows": rows, "fps": meta["fps"], "n_frames": meta["n_frames"],
            "n_samples": meta["n_samples"], "passes": meta["passes"], "seconds": round(seconds, 4),
            "cache_hit": hit, "hash_seconds": round(hash_seconds, 4)}


def opencv_threads(cfg: KeyframeConfig, workers: int, cores: int) -> int:
    """The process's share of the cores, less the one its decoding thread keeps busy."""
    if cfg.cv_threads:
        return cfg.cv_threads
    share = max(1, cores // workers)
    return max(1, share - 1) if cfg.decode_ahead else share


def _init_worker(threads: int, parent: int) -> None:
    from embodied_r.children import die_with_parent

    die_with_parent(parent)
    cv2.setNumThreads(threads)


def _process_all(todo: list[tuple[str, str]], work: Path, cfg: KeyframeConfig, cache: str | None, workers: int,
                 threads: int) -> Iterator[dict]:
    if workers <= 1:
        before = cv2.getNumThreads()
        cv2.setNumThreads(threads)
        try:
            for vid, path in todo:
                yield _process_video(vid, path, str(work), cfg, cache)
        finally:
            cv2.setNumThreads(before)
        return
    # spawn: a forked child would inherit OpenCV's and FFmpeg's thread pools in a broken state.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(threads, os.getpid())) as pool:
        with children_deaf_to_ctrl_c():  # the pool starts its workers as tasks are submitted
            futures = [pool.submit(_process_video, vid, path, str(work), cfg, cache) for vid, path in todo]
        for fut in as_completed(futures):
            yield fut.result()


def _work(videos: list[tuple[str, str]], work: Path, cfg: KeyframeConfig) -> int:
    """The videos not yet in ``work``'s item log; the number of worker processes used."""
    log = ItemLog(work / "items.jsonl", key="video_id")
    done = log.done_ids()
    todo = [(v, p) for v, p in videos if v not in done]
    progress.keep(len(done))
    cache = str(cache_root(cfg)) if cfg.cache else None
    cores = os.cpu_count() or 1
    workers = max(1, min(cfg.workers or cores, len(todo)))
    threads = opencv_threads(cfg, workers, cores)
    for n, record in enumerate(_process_all(todo, work, cfg, cache, workers, threads), start=1):
        log.append(record)
        progress.update("keyframes", len(done) + n, len(videos))  # counted once logged
        item_done("keyframes")
    return workers


def _finish(work: Path, videos: list[tuple[str, str]], workers: int, seconds: float) -> dict[str, Any]:
    records = {r["video_id"]: r for r in ItemLog(work / "items.jsonl", key="video_id").read()}
    finished = [records[v] for v, _ in videos if v in records]
    ok = [r for r in finished if r["status"] == "done"]
    bad = [r for r in finished if r["status"] != "done"]
    rows = [row for r in ok for row in r["rows"]]
    write_parquet_atomic(table_from_records(rows, schemas.KEYFRAMES), work / "keyframes.parquet")
    write_parquet_atomic(table_from_records(
        [{"stage": "keyframes", "item": r["video_id"], "reason": r["reason"]} for r in bad],
        schemas.FAILURES), work / "failures.parquet")
    shown_videos = [r for r in ok if r["rows"]][:MONTAGE_VIDEOS]
    shown = shown_videos[0] if shown_videos else None
    if shown_videos:
        make_video_montage([(r["video_id"], r["rows"]) for r in shown_videos], work, work / "montage.jpg")
    counts = [len(r["rows"]) for r in ok]
    return {
        "videos": len(videos), "done": len(ok), "failed": len(bad),
        "failure_reasons": dict(Counter(r["code"] for r in bad)), "keyframes_total": sum(counts),
        "keyframes_mean": round(sum(counts) / len(counts), 3) if counts else 0.0,
        "keyframes_min": min(counts, default=0), "keyframes_max": max(counts, default=0),
        "frames_decoded": sum(r["n_frames"] for r in ok if not r.get("cache_hit")),
        "video_seconds": round(sum(r["n_frames"] / r["fps"] for r in ok), 3),
        "cache_hits": sum(1 for r in ok if r.get("cache_hit")),
        "hash_seconds": round(sum(r.get("hash_seconds", 0.0) for r in ok), 3),
        "processing_seconds": round(sum(r["seconds"] for r in ok), 3),
        "montage_video": shown["video_id"] if shown else "",
        "montage_videos": [r["video_id"] for r in shown_videos],
        "workers": workers, "seconds": round(seconds, 3),
    }


def run_keyframes(catalog: Path, out: Path, cfg: KeyframeConfig | None = None,
                  shard: int | None = None) -> dict:
    """``shard``: only that one of ``cfg.shards`` (0-based)."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    cfg = cfg or KeyframeConfig()
    videos = _catalog_videos(catalog)
    if cfg.shards > 1:
        paths = dict(videos)

        def work_shard(work: Path, mine: list[str]) -> dict[str, Any]:
            workers = _work([(v, paths[v]) for v in mine], work, cfg)
            ids = set(mine)
            ended = [r for r in ItemLog(work / "items.jsonl", key="video_id").read() if r["video_id"] in ids]
            return {"workers": workers, "done": sum(1 for r in ended if r["status"] == "done"),
                    "failed": sum(1 for r in ended if r["status"] != "done")}

        def finish(work: Path, shards: list[dict[str, Any]]) -> dict[str, Any]:
            return _finish(work, videos, max(s["workers"] for s in shards), sum(s["seconds"] for s in shards))

        return run_sharded(out, cfg.shards, Sharding(
            ids=[v for v, _ in videos], files=("frames",), finish=finish, work=work_shard), shard)
    start = time.perf_counter()
    with stage_folder(out) as work:
        workers = _work(videos, work, cfg)
        summary = _finish(work, videos, workers, time.perf_counter() - start)
        write_summary(work, summary)
    return summary


def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    cfg = KeyframeConfig.model_validate(config)
    return run_keyframes(Path(inputs["catalog"]), out, cfg, parse_selection(inputs.get(SHARD_INPUT), cfg.shards))
