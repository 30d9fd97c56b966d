"""Key frames by view overlap (the Embodied-R rule): a sample is kept when the last key frame's
view, warped by a RANSAC homography of ORB matches, covers less than ``overlap_threshold`` of it,
or cannot be measured. Matching runs at ``match_width`` (the overlap is a ratio of areas) and
the overlap is the intersection of two convex polygons, not of full-size masks."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np

from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.video import FrameSampler, JpegSpool, KeyframeResult, encode_jpeg


@dataclass
class _Features:
    points: np.ndarray  # (N, 2) float32 at matching resolution
    descriptors: np.ndarray | None
    size: tuple[int, int]


class _OverlapMatcher:
    def __init__(self, cfg: KeyframeConfig, width: int, height: int):
        self.cfg = cfg
        self.scale = min(1.0, cfg.match_width / width) if cfg.match_width and width > 0 else 1.0
        self.size = (max(1, round(width * self.scale)), max(1, round(height * self.scale)))
        self.threshold = max(1.0, cfg.ransac_reproj_threshold * self.scale)
        self.orb = cv2.ORB_create(nfeatures=cfg.orb_features)
        self.bf = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=cfg.cross_check)
        w, h = self.size
        self.rect = np.float32([[0, 0], [w, 0], [w, h], [0, h]])

    def features(self, image: np.ndarray) -> _Features:
        gray = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 else image
        if self.scale < 1.0:
            gray = cv2.resize(gray, self.size, interpolation=cv2.INTER_AREA)
        keypoints, descriptors = self.orb.detectAndCompute(gray, None)
        points = np.asarray(cv2.KeyPoint_convert(keypoints), np.float32).reshape(-1, 2)
        return _Features(points, descriptors, self.size)

    def overlap(self, ref: _Features, cur: _Features) -> float | None:
        """Share of the reference view covered by the current one; None when matching fails."""
        if ref.descriptors is None or cur.descriptors is None or len(ref.points) < 4 or len(cur.points) < 4:
            return None
        if self.cfg.cross_check:
            pairs = [(m.queryIdx, m.trainIdx) for m in self.bf.match(cur.descriptors, ref.descriptors)]
            q, t = np.array(pairs, np.int64).reshape(-1, 2).T
        else:
            q, t = self._ratio_matches(cur.descriptors, ref.descriptors)
        if len(q) < self.cfg.min_matches:
            return None
        homography, mask = cv2.findHomography(cur.points[q], ref.points[t], cv2.RANSAC, self.threshold)
        if homography is None or mask is None or int(mask.sum()) < self.cfg.min_inliers:
            return None
        quad = cv2.perspectiveTransform(self.rect.reshape(-1, 1, 2), homography).reshape(-1, 2)
        # A mirrored or folded quad is a degenerate fit, not a view.
        if not np.isfinite(quad).all() or _signed_area(quad) <= 0 or not cv2.isContourConvex(quad):
            return None
        area, _ = cv2.intersectConvexConvex(self.rect, quad.astype(np.float32))
        return float(area) / (self.size[0] * self.size[1])

    def _ratio_matches(self, query: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Query and train indices passing the ratio test, in query order: what
        ``BFMatcher.knnMatch(k=2)`` and the test on its matches give."""
        if len(train) < 2:  # knnMatch finds no second neighbour, so nothing passes
            return np.empty(0, np.intp), np.empty(0, np.intp)
        nearest, first, second = nearest_two(query, train)
        q = np.flatnonzero(first < self.cfg.ratio_test * second.astype(np.float64))
        return q, nearest[q]


_POPCOUNT = getattr(np, "bitwise_count", None)  # numpy >= 2.0
_TABLE_CELLS = 1 << 18


def nearest_two(query: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query descriptor, the nearest train descriptor by Hamming distance, that distance and
    the second-nearest's. Ties go to the lower index, as in OpenCV's ``batchDistance``, so both
    match alike; numpy >= 2's popcounts over a whole table cost a third less at 500 features."""
    if _POPCOUNT is None or query.shape[1] % 8 or query.shape[1] > 4096:
        dist, index = cv2.batchDistance(query, train, cv2.CV_32S, normType=cv2.NORM_HAMMING, K=2, update=0,
                                        crosscheck=False)
        return index[:, 0], dist[:, 0], dist[:, 1]
    words = np.ascontiguousarray(query).view(np.uint64)
    train_words = np.ascontiguousarray(np.ascontiguousarray(train).view(np.uint64).T)  # one row per word
    n = len(words)
    nearest, first, second = np.empty(n, np.intp), np.empty(n, np.uint16), np.empty(n, np.uint16)
    block = max(1, _TABLE_CELLS // len(train))  # query rows at a time: a few MB, whatever the counts
    xor = np.empty((min(n, block), len(train)), np.uint64)
    bits = np.empty(xor.shape, np.uint8)
    dist = np.empty(xor.shape, np.uint16)  # up to 8 bits a byte: more than uint8 holds
    for start in range(0, n, block):
        stop = min(n, start + block)
        x, b, d = xor[:stop - start], bits[:stop - start], dist[:stop - start]
        d[:] = 0
        for k in range(words.shape[1]):
            np.bitwise_xor(words[start:stop, k, None], train_words[k], out=x)
            _POPCOUNT(x, out=b)
            d += b
        rows = np.arange(stop - start)
        nearest[start:stop] = best = d.argmin(axis=1)  # the first of equal distances
        first[start:stop] = d[rows, best]
        d[rows, best] = np.iinfo(d.dtype).max
        second[start:stop] = d.min(axis=1)
    return nearest, first, second


def _signed_area(poly: np.ndarray) -> float:
    x, y = poly[:, 0].astype(np.float64), poly[:, 1].astype(np.float64)
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def fill_spots(n_frames: int, target: int, step: int = 1) -> list[int]:
    spots = (min(n_frames - 1, round(x / step) * step) for x in np.linspace(0, n_frames - 1, target))
    return list(dict.fromkeys(spots))


def fill_indices(kept: Sequence[int], n_frames: int, target: int, step: int = 1) -> list[int]:
    chosen = set(kept)
    want = min(target, n_frames)
    spots = [c for c in fill_spots(n_frames, target, step) if c not in chosen]

    def gap(c: int) -> int:
        return min((abs(c - e) for e in chosen), default=n_frames)

    while len(chosen) < want:
        pool = spots or [c for c in range(n_frames) if c not in chosen]
        best = max(pool, key=gap)
        chosen.add(best)
        if best in spots:
            spots.remove(best)
    return sorted(chosen - set(kept))


class OverlapRule:
    def __init__(self, cfg: KeyframeConfig):
        self.cfg = cfg
        self.matcher: _OverlapMatcher | None = None
        self.ref: _Features | None = None

    def consider(self, image: np.ndarray, is_last: bool) -> tuple[str | None, float]:
        if self.matcher is None:
            self.matcher = _OverlapMatcher(self.cfg, image.shape[1], image.shape[0])
        feats = self.matcher.features(image)
        overlap: float | None = None
        if self.ref is None:
            reason: str | None = "first"
        else:
            overlap = self.matcher.overlap(self.ref, feats)
            reason = ("match_failed" if overlap is None else
                      "low_overlap" if overlap < self.cfg.overlap_threshold else None)
            reason = "last" if is_last else reason
        if reason is not None:
            self.ref = feats
        return reason, math.nan if overlap is None else overlap


def thin_evenly(items: Sequence, m: int) -> list:
    """m evenly spaced items, first and last included (the official formula leans towards the start)."""
    n = len(items)
    if n <= m:
        return list(items)
    return [items[round(x)] for x in np.linspace(0, n - 1, m)]


def final_selection(kept: Sequence[tuple[int, float, str]], n_frames: int, cfg: KeyframeConfig, step: int = 1
                    ) -> list[tuple[int, float, str]]:
    """The rule's key frames topped up with evenly spaced ``fill`` frames to ``min_frames`` and
    thinned evenly to ``max_frames``."""
    kept = list(kept)
    if len(kept) < cfg.min_frames:
        fills = fill_indices([k[0] for k in kept], n_frames, cfg.min_frames, step)
        kept = sorted(kept + [(i, math.nan, "fill") for i in fills])
    return thin_evenly(kept, cfg.max_frames)


def extract_keyframes(video_path: str | Path, config: KeyframeConfig | None = None, *,
                      keep_images: bool = True) -> KeyframeResult:
    """Key frames of one video; raises ``VideoError`` for a missing, empty, corrupt or 0-fps file."""
    cfg = config or KeyframeConfig()
    if cfg.mode == "official":
        from embodied_r.keyframes.official import extract_official

        return extract_official(video_path, cfg, keep_images=keep_images)
    start = time.perf_counter()
    spool = JpegSpool() if keep_images else None
    try:
        with FrameSampler(video_path, cfg.sample_fps, threads=cfg.decode_threads, ahead=cfg.decode_ahead) as sampler:
            info, step = sampler.info, sampler.step
            planned = set(fill_spots(info.frame_count, cfg.min_frames, step)) if info.frame_count else set()
            rule = OverlapRule(cfg)
            kept: list[tuple[int, float, str]] = []
            n_samples = 0
            for index, image, is_last in sampler:
                n_samples += 1
                reason, overlap = rule.consider(image, is_last)
                if reason is not None:
                    kept.append((index, overlap, reason))
                if spool is not None and (reason is not None or index in planned):
                    spool.put(index, encode_jpeg(image, cfg))
            n_frames, passes = sampler.frames_read, sampler.passes
        kept = final_selection(kept, n_frames, cfg, step)
        images, more = spool.take(video_path, [k[0] for k in kept], cfg) if spool is not None else (None, 0)
    finally:
        if spool is not None:
            spool.close()
    return KeyframeResult.of(video_path, info, step, n_frames, n_samples, kept, images, start, passes + more)
