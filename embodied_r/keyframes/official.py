"""Key frames chosen exactly as the official code chose them (``keyframes.mode: official``;
its ``train/conver_format/utils.py``). Apart on purpose: frames are streamed, a container that
miscounts its frames still gets its true last frame, fps < 1 samples every frame instead of
crashing, and the frames are saved as JPEGs directly."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Sequence

import cv2
import numpy as np

from embodied_r.keyframes.video import FrameSampler, JpegSpool, KeyframeResult, encode_jpeg, probe_video


def constrained_sampling(items: Sequence[Any], m: int) -> list[Any]:
    """The official thinning: ``items`` if at most ``m``, else the first, the items at
    ``round(i * (n - 2) / (m - 2)) + 1`` for i = 0 .. m - 3 (Python's round: halves to
    even), and the last. It always keeps the second item and leaves a gap before the
    last, so it leans towards the start (10 items to 4: positions 0, 1, 5, 9)."""
    n = len(items)
    if n <= m:
        return list(items)
    if m <= 2:  # never asked by the official code (m is 4 or 32); its formula divides by zero
        return [items[0], items[-1]][:m]
    step = (n - 2) / (m - 2)
    return [items[0], *[items[int(round(i * step)) + 1] for i in range(m - 2)], items[-1]]


def official_step(fps: float, sample_fps: float = 1.0) -> int:
    """Source frames between samples: ``int(fps)`` at 1 fps (truncated), at least 1."""
    return max(1, int(fps / sample_fps))


def sample_positions(frame_count: int, step: int) -> list[int]:
    """The source frames the official code samples: 0, step, 2*step, ... and the last."""
    keep = list(range(0, frame_count, step))
    if frame_count > 0 and keep[-1] != frame_count - 1:
        keep.append(frame_count - 1)
    return keep


class OfficialMatcher:
    """ORB at full resolution, cross-check matching (no ratio test, no distance cut), RANSAC
    homography, mask overlap; compared with the last *key* frame, not the last sample."""

    def __init__(self, orb_features: int = 500, ransac_reproj_threshold: float = 5.0, min_matches: int = 10):
        self.orb = cv2.ORB_create(nfeatures=orb_features)
        self.bf = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True)
        self.threshold = ransac_reproj_threshold
        self.min_matches = min_matches

    def features(self, image: np.ndarray) -> tuple[Any, Any, tuple[int, int]]:
        gray = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 else image
        keypoints, descriptors = self.orb.detectAndCompute(gray, None)
        return keypoints, descriptors, gray.shape[:2]

    def overlap(self, ref: tuple[Any, Any, tuple[int, int]], cur: tuple[Any, Any, tuple[int, int]]) -> float | None:
        """The share of the reference frame covered by the current one; None when the
        official code would keep the frame without measuring (no descriptors, too few
        matches, no homography)."""
        ref_kp, ref_des, (h, w) = ref
        cur_kp, cur_des, _ = cur
        if ref_des is None or cur_des is None:
            return None
        matches = sorted(self.bf.match(ref_des, cur_des), key=lambda m: m.distance)
        if len(matches) <= self.min_matches:
            return None
        src = np.float32([ref_kp[m.queryIdx].pt for m in matches]).reshape(-1, 1, 2)
        dst = np.float32([cur_kp[m.trainIdx].pt for m in matches]).reshape(-1, 1, 2)
        homography, _ = cv2.findHomography(dst, src, cv2.RANSAC, self.threshold)
        if homography is None:
            return None
        corners = np.float32([[0, 0], [w, 0], [w, h], [0, h]]).reshape(-1, 1, 2)
        warped = cv2.perspectiveTransform(corners, homography)
        return mask_overlap(corners, warped, w, h)


def mask_overlap(corners: np.ndarray, warped: np.ndarray, w: int, h: int) -> float:
    """The official ``calculate_overlap_ratio``: both outlines truncated to integers and
    filled into w x h masks; the pixels in both over the frame's area. A degenerate fit
    whose outline is not finite covers nothing (the official cast is undefined there);
    far-away corners are clamped so that the cast to int32 cannot overflow."""
    if not np.isfinite(warped).all():
        return 0.0
    a = np.zeros((h, w), np.uint8)
    b = np.zeros((h, w), np.uint8)
    cv2.fillPoly(a, np.int32([corners.reshape(-1, 2)]), 1)
    limit = 1e6
    cv2.fillPoly(b, np.int32([np.clip(warped.reshape(-1, 2), -limit, limit)]), 1)
    return float(np.count_nonzero(cv2.bitwise_and(a, b))) / (w * h)


def extract_official(video_path: str | Path, cfg: Any, *, keep_images: bool = True) -> KeyframeResult:
    """``cfg``: a ``KeyframeConfig``; the fast mode's ratio test, inlier count and matching
    width are not read."""
    start = time.perf_counter()
    info = probe_video(video_path)
    step = official_step(info.fps, cfg.sample_fps)
    # The fill rule takes its frames from all samples: plan them from the container's count.
    expected = sample_positions(info.frame_count, step)
    planned = set(constrained_sampling(expected, cfg.min_frames)) if expected else set()
    spool = JpegSpool() if keep_images else None
    matcher = OfficialMatcher(cfg.orb_features, cfg.ransac_reproj_threshold, cfg.min_matches)
    try:
        samples, kept, n_frames, passes = _scan(video_path, cfg, info.fps / step, matcher, planned, spool)
        if len(kept) < cfg.min_frames:
            # Discard the key frames: min_frames of all the samples, by the same formula.
            by_index = {k[0]: k for k in kept}
            chosen = constrained_sampling(samples, cfg.min_frames)
            kept = [by_index.get(i) or (i, math.nan, "fill") for i in chosen]
        elif len(kept) > cfg.max_frames:
            kept = constrained_sampling(kept, cfg.max_frames)
        images, more = spool.take(video_path, [k[0] for k in kept], cfg) if spool is not None else (None, 0)
    finally:
        if spool is not None:
            spool.close()
    return KeyframeResult.of(video_path, info, step, n_frames, len(samples), kept, images, start, passes + more)


def _scan(video_path: str | Path, cfg: Any, rate: float, matcher: OfficialMatcher, planned: set[int],
          spool: JpegSpool | None) -> tuple[list[int], list[tuple[int, float, str]], int, int]:
    """One pass over the samples: (samples, key frames as (index, overlap, reason), frames
    read, passes); the key frames and the planned fill frames go into ``spool``."""
    # FrameSampler samples every round(fps / rate) frames: ``rate`` gives the official step.
    with FrameSampler(video_path, rate, threads=cfg.decode_threads, ahead=cfg.decode_ahead) as sampler:
        samples: list[int] = []
        kept: list[tuple[int, float, str]] = []
        ref = None
        for index, image, is_last in sampler:
            samples.append(index)
            feats = matcher.features(image)
            overlap: float | None = None
            if ref is None:
                reason: str | None = "first"
            else:
                overlap = matcher.overlap(ref, feats)
                reason = ("match_failed" if overlap is None else
                          "low_overlap" if overlap < cfg.overlap_threshold else None)
                if reason is None and is_last:
                    reason = "last"  # appended after the loop in the official code
            if reason is not None:
                if reason != "last":
                    ref = feats
                kept.append((index, math.nan if overlap is None else overlap, reason))
            if spool is not None and (reason is not None or index in planned):
                spool.put(index, encode_jpeg(image, cfg))
        return samples, kept, sampler.frames_read, sampler.passes
