"""The `official` key-frame mode: the official code's rule step by step, checked against that
rule written out plainly (every 1-fps frame held in a list, as the official code holds them)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from embodied_r.keyframes.cache import params_hash
from embodied_r.keyframes.extract import extract_keyframes
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.official import constrained_sampling, mask_overlap, official_step, sample_positions
from embodied_r.synthetic.world import write_motion_video

OFFICIAL = KeyframeConfig(mode="official")


def plain_official(path: Path) -> list[int]:
    """The official ``extract_keyframes_from_video`` written plainly: source-frame indices."""
    cap = cv2.VideoCapture(str(path))
    count, fps = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), cap.get(cv2.CAP_PROP_FPS)
    keep = list(range(0, count, int(fps)))
    if count - 1 not in keep:
        keep.append(count - 1)
    frames, index = [], 0
    ok, frame = cap.read()
    while ok:
        if index in keep:
            frames.append(frame)
        ok, frame = cap.read()
        index += 1
    cap.release()
    orb, bf = cv2.ORB_create(), cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True)
    kept = [0]
    prev_kp, prev_des = orb.detectAndCompute(cv2.cvtColor(frames[0], cv2.COLOR_BGR2GRAY), None)
    for t in range(1, len(frames)):
        gray = cv2.cvtColor(frames[t], cv2.COLOR_BGR2GRAY)
        kp, des = orb.detectAndCompute(gray, None)
        key = True
        if prev_des is not None and des is not None:
            matches = sorted(bf.match(prev_des, des), key=lambda m: m.distance)
            if len(matches) > 10:
                src = np.float32([prev_kp[m.queryIdx].pt for m in matches]).reshape(-1, 1, 2)
                dst = np.float32([kp[m.trainIdx].pt for m in matches]).reshape(-1, 1, 2)
                m, _ = cv2.findHomography(dst, src, cv2.RANSAC, 5.0)
                if m is not None:
                    h, w = gray.shape
                    corners = np.float32([[0, 0], [w, 0], [w, h], [0, h]]).reshape(-1, 1, 2)
                    a, b = np.zeros((h, w), np.uint8), np.zeros((h, w), np.uint8)
                    cv2.fillPoly(a, np.int32([corners.reshape(-1, 2)]), 1)
                    cv2.fillPoly(b, np.int32([cv2.perspectiveTransform(corners, m).reshape(-1, 2)]), 1)
                    key = np.sum(cv2.bitwise_and(a, b)) / (w * h) < 0.5
        if key:
            kept.append(t)
            prev_kp, prev_des = kp, des
    if kept[-1] != len(frames) - 1:
        kept.append(len(frames) - 1)
    if len(kept) < 4:
        kept = constrained_sampling(list(range(len(frames))), 4)
    elif len(kept) > 32:
        kept = constrained_sampling(kept, 32)
    return [keep[i] for i in kept]


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("official")
    plans = {
        "static": [("hover", 10.0, 0.0)],  # fewer than 4 key frames: the fill rule
        "mixed": [("turn left", 3.0, 20.0), ("rise", 2.0, 4.0), ("turn right", 3.0, 45.0),
                  ("fly forward", 3.0, 1.2)],
        "spin": [("turn right", 40.0, 60.0)],  # a key frame a second: more than 32, thinned
    }
    return {k: write_motion_video(d / f"{k}.mp4", m, seed=3, width=480, height=270) for k, m in plans.items()}


def test_constrained_sampling_leans_to_the_start() -> None:
    assert constrained_sampling(list(range(10)), 4) == [0, 1, 5, 9]
    assert constrained_sampling(list(range(100)), 32)[-4:] == [89, 92, 96, 99]
    assert constrained_sampling(list(range(40)), 32)[-4:] == [35, 36, 38, 39]
    assert constrained_sampling(list(range(64)), 32)[-4:] == [57, 59, 61, 63]
    assert constrained_sampling([1, 2, 3], 4) == [1, 2, 3]
    assert constrained_sampling(list(range(5)), 2) == [0, 4]


def test_the_official_step_truncates() -> None:
    assert official_step(29.97) == 29 and official_step(30.0) == 30 and official_step(0.5) == 1
    assert sample_positions(95, 30) == [0, 30, 60, 90, 94] and sample_positions(91, 30) == [0, 30, 60, 90]


def test_mask_overlap_is_the_share_of_the_reference_covered() -> None:
    w, h = 100, 50
    corners = np.float32([[0, 0], [w, 0], [w, h], [0, h]]).reshape(-1, 1, 2)
    shifted = corners + np.float32([50, 0])
    assert mask_overlap(corners, corners, w, h) == 1.0
    assert mask_overlap(corners, shifted, w, h) == pytest.approx(0.5)
    assert mask_overlap(corners, np.full((4, 1, 2), np.nan, np.float32), w, h) == 0.0


@pytest.mark.parametrize("clip", ["static", "mixed", "spin"])
def test_official_mode_picks_the_frames_the_official_code_picks(clips: dict[str, Path], clip: str) -> None:
    result = extract_keyframes(clips[clip], OFFICIAL)
    assert result.indices == plain_official(clips[clip])
    assert len(result.images) == len(result)
    first = cv2.imdecode(np.frombuffer(result.images[0], np.uint8), cv2.IMREAD_COLOR)
    assert first.shape[:2] == (270, 480)  # jpeg_max_side 0 keeps the source size


def test_official_fill_and_thinning(clips: dict[str, Path]) -> None:
    static = extract_keyframes(clips["static"], OFFICIAL)
    # 11 one-fps frames, no key frame but the first and last: 4 of all of them, leaning to the start.
    assert static.indices == [0, 30, 150, 299] and static.reasons == ["first", "fill", "fill", "last"]
    spin = extract_keyframes(clips["spin"], OFFICIAL)
    assert len(spin) == 32 and spin.indices[:3] == [0, 30, 60] and spin.indices[-1] == spin.n_frames - 1


def test_the_mode_is_part_of_the_cache_key() -> None:
    assert params_hash(OFFICIAL) != params_hash(KeyframeConfig())
    assert KeyframeConfig().mode == "fast"


def test_a_29_97_fps_video_is_sampled_every_29_frames(tmp_path: Path) -> None:
    # NTSC containers say 30000/1001 fps: the official rule steps int(fps) = 29 source frames,
    # so its 1-fps grid drifts from the fast mode's (round(fps) = 30) by a frame a second.
    path = write_motion_video(tmp_path / "ntsc.mp4", [("turn right", 3.0, 60.0), ("fly forward", 2.0, 1.2)],
                              seed=5, width=320, height=180, fps=30000 / 1001)
    result = extract_keyframes(path, OFFICIAL.model_copy(update={"min_frames": 2, "max_frames": 1000}))
    assert result.fps == pytest.approx(29.97, abs=0.01) and result.sample_step == 29
    assert result.n_samples == len(sample_positions(result.n_frames, 29))
    assert all(i % 29 == 0 for i in result.indices[:-1]) and result.indices[-1] == result.n_frames - 1
    assert extract_keyframes(path, OFFICIAL).indices == plain_official(path)
    assert extract_keyframes(path, KeyframeConfig(mode="fast", min_frames=2, max_frames=1000)).sample_step == 30
