"""How frames are decoded (FFmpeg threads, decoding ahead in a second thread) and how descriptors
are matched must not change which frames are kept; the frames kept from a varied flight are pinned."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from embodied_r.keyframes import extract
from embodied_r.keyframes.extract import extract_keyframes, nearest_two
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.stage import opencv_threads
from embodied_r.keyframes.video import FrameSampler, auto_decode_threads
from embodied_r.synthetic.world import write_motion_video

# Slow pans, fast turns, flights and a still spell: key frames for every reason.
FLIGHT = [("turn right", 4.0, 15.0), ("fly forward", 3.0, 1.15), ("turn left", 2.0, 70.0),
          ("hover", 3.0, 0.0), ("rise", 2.0, 4.0), ("fly backward", 3.0, 1.15),
          ("turn right", 3.0, 40.0), ("descend", 2.0, 4.0), ("turn left", 2.0, 10.0)]


@pytest.fixture(scope="module")
def flight(tmp_path_factory) -> Path:
    return write_motion_video(tmp_path_factory.mktemp("flight") / "flight.mp4", FLIGHT, seed=3)


def _decision(r) -> tuple:
    return (r.n_frames, r.n_samples, r.indices, r.reasons,
            [None if math.isnan(o) else o for o in r.overlaps], r.images, r.passes)


def test_key_frames_of_a_varied_flight_are_pinned(flight):
    # Taken from the extractor that decoded on the calling thread with FFmpeg's default threads.
    # Two overlaps sit just under the 0.5 threshold, so any drift in the rule shows here.
    r = extract_keyframes(flight, keep_images=False)
    assert (r.n_frames, r.n_samples) == (720, 25)
    assert r.indices == [0, 60, 120, 210, 240, 270, 480, 540, 570, 600, 719]
    assert r.reasons == ["first", "low_overlap", "low_overlap", "low_overlap", "match_failed", "match_failed",
                         "match_failed", "low_overlap", "low_overlap", "match_failed", "last"]
    measured = [(o, want) for o, want in zip(r.overlaps, [None, 0.4992, 0.4971, 0.4282, None, None, None,
                                                          0.3086, 0.3305, None, 0.5238]) if want is not None]
    assert [o for o, _ in measured] == pytest.approx([w for _, w in measured], abs=1e-4)
    dense = extract_keyframes(flight, KeyframeConfig(sample_fps=3.0, max_frames=12), keep_images=False)
    assert dense.n_samples == 73
    assert dense.indices == [0, 60, 200, 220, 230, 240, 260, 270, 410, 530, 590, 719]


@pytest.mark.parametrize("config", [
    {"min_frames": 4, "max_frames": 32},
    {"min_frames": 2, "max_frames": 1000},  # the rule alone
    {"sample_fps": 3.0, "max_frames": 12},  # thinned
    {"min_frames": 16},  # topped up
    {"mode": "official"},  # the official rule, decoded the same way
])
def test_decoding_ahead_or_single_threaded_keeps_the_same_frames(flight, config):
    inline = extract_keyframes(flight, KeyframeConfig(**config, decode_threads=0, decode_ahead=0))
    for how in ({}, {"decode_threads": 2, "decode_ahead": 1}, {"decode_threads": 1, "decode_ahead": 0}):
        assert _decision(extract_keyframes(flight, KeyframeConfig(**config, **how))) == _decision(inline), how


def test_decoding_ahead_yields_the_same_frames_and_bounds_the_queue(flight):
    with FrameSampler(flight, 2.0) as sampler:
        inline = [(i, img.tobytes(), last) for i, img, last in sampler]

    class Counting(FrameSampler):
        produced = 0

        def _frames(self):
            for item in super()._frames():
                self.produced += 1
                yield item

    got, worst = [], 0
    with Counting(flight, 2.0, threads=1, ahead=2) as sampler:
        for i, img, last in sampler:
            got.append((i, img.tobytes(), last))
            worst = max(worst, sampler.produced - len(got))
            time.sleep(0.002)  # a slow consumer lets the decoder run ahead
    assert got == inline
    # Queued frames (2) plus the one the decoder holds while it waits for room.
    assert worst <= 3


def test_stopping_early_ends_the_decoding_thread(flight):
    before = threading.active_count()
    with FrameSampler(flight, 5.0, ahead=1) as sampler:
        frames = iter(sampler)
        next(frames)
        worker = sampler._worker
        assert worker is not None and worker.is_alive()
    assert not worker.is_alive() and threading.active_count() == before

    with pytest.raises(RuntimeError, match="consumer failed"):
        with FrameSampler(flight, 5.0, ahead=1) as sampler:
            for _ in sampler:
                raise RuntimeError("consumer failed")
    assert not sampler._worker.is_alive() and threading.active_count() == before


def test_opencv_threads_leave_a_core_to_the_decoding_thread():
    cfg = KeyframeConfig()
    assert opencv_threads(cfg, workers=1, cores=2) == 1
    assert opencv_threads(cfg, workers=2, cores=2) == 1
    assert opencv_threads(cfg, workers=1, cores=8) == 7
    assert opencv_threads(KeyframeConfig(decode_ahead=0), workers=1, cores=2) == 2
    assert opencv_threads(KeyframeConfig(cv_threads=3), workers=1, cores=2) == 3


def test_ffmpeg_threads_follow_the_frame_size_unless_forced(flight, tmp_path):
    assert auto_decode_threads(640, 360) == auto_decode_threads(640, 480) == 1
    assert auto_decode_threads(1280, 720) == auto_decode_threads(480, 854) == 0
    large = write_motion_video(tmp_path / "large.mp4", FLIGHT[:1], seed=3, width=960, height=540)

    def threads_used(path: Path, threads: int | None) -> float:
        with FrameSampler(path, threads=threads) as sampler:
            return sampler.cap.get(cv2.CAP_PROP_N_THREADS)

    own = threads_used(large, 0)  # FFmpeg's own choice: one per core
    assert (threads_used(flight, None), threads_used(large, None)) == (1, own)
    assert (threads_used(flight, 2), threads_used(large, 1)) == (2, 1)  # forced either way
    by_size = extract_keyframes(large, KeyframeConfig(min_frames=2))
    assert _decision(extract_keyframes(large, KeyframeConfig(min_frames=2, decode_threads=1))) == _decision(by_size)


@pytest.mark.parametrize("popcount", [True, False], ids=["numpy-popcount", "opencv"])
def test_nearest_two_agrees_with_opencvs_knn_match_ties_included(flight, monkeypatch, popcount):
    if not popcount:
        monkeypatch.setattr(extract, "_POPCOUNT", None)
    monkeypatch.setattr(extract, "_TABLE_CELLS", 1000)  # query rows in several blocks
    orb = cv2.ORB_create(500)
    with FrameSampler(flight, 0.5) as sampler:
        real = [orb.detectAndCompute(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY), None)[1] for _, img, _ in sampler]
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (6, 32), dtype=np.uint8)

    def near_copies(n: int) -> np.ndarray:  # few distinct rows, few bits flipped: many equal distances
        return base[rng.integers(0, len(base), n)] ^ np.packbits(rng.random((n, 256)) < 0.01, axis=1)

    cases = [*zip(real[1:], real[:-1]), (near_copies(300), near_copies(200)), (near_copies(50), base[[0, 0, 1, 1]]),
             (~base[:3], base[:2])]  # the farthest possible: every bit differs
    for query, train in cases:
        knn = cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(query, train, k=2)
        want = [(m[0].trainIdx, m[0].distance, m[1].distance) for m in knn]
        nearest, first, second = nearest_two(query, train)
        assert list(zip(nearest.tolist(), first.tolist(), second.tolist())) == want
