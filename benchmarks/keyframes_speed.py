"""Key-frame extraction speed and memory, against decoding alone and the original approach.

Run:  python benchmarks/keyframes_speed.py [--short 60 --long 180 --sizes 640x360,1280x720]

Synthetic videos (30 fps, slow and fast motion) are generated into a temporary folder. In one
process, each video is timed three ways:
  decode   every frame grab()-ed, nothing else (the floor for any method that must decode)
  ours     embodied_r.keyframes.extract_keyframes with its defaults (JPEGs of kept frames included)
  original a straightforward version of the official code: every frame read(), the 1-fps frames
           held in a list, full-resolution ORB, cross-check matching, overlap from two
           full-size masks, kept frames JPEG-encoded
Peak memory is measured in a second pass with tracemalloc (OpenCV's frames are numpy arrays,
so tracemalloc sees them), so the timings are not slowed by tracing. "ceiling" is the
speed-up over the original that a method would reach if it cost nothing beyond decoding every
frame (original time / decode time): with OpenCV every frame must be decoded, so no extractor
built on it can pass that line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from embodied_r.keyframes import KeyframeConfig, extract_keyframes  # noqa: E402
from embodied_r.synthetic import write_motion_video  # noqa: E402

# Slow pans, fast turns, flights and still spells: a varied number of key frames per minute.
PATTERN = [("turn right", 4.0, 15.0), ("fly forward", 3.0, 1.15), ("turn left", 2.0, 70.0),
           ("hover", 3.0, 0.0), ("rise", 2.0, 4.0), ("fly backward", 3.0, 1.15),
           ("turn right", 3.0, 40.0), ("descend", 2.0, 4.0), ("turn left", 2.0, 10.0)]


def make_video(path: Path, seconds: float, width: int, height: int) -> Path:
    motions, total, i = [], 0.0, 0
    while total < seconds:
        action, dur, rate = PATTERN[i % len(PATTERN)]
        dur = min(dur, seconds - total)
        motions.append((action, dur, rate))
        total += dur
        i += 1
    return write_motion_video(path, motions, seed=1, width=width, height=height, fps=30.0)


def decode_only(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.grab():
        n += 1
    cap.release()
    return n


def original_approach(path: Path) -> int:
    """The official pipeline, written plainly: returns the number of key frames."""
    cap = cv2.VideoCapture(str(path))
    count, fps = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), cap.get(cv2.CAP_PROP_FPS)
    keep = set(range(0, count, int(fps))) | {count - 1}
    frames, index = [], 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if index in keep:
            frames.append(frame)
        index += 1
    cap.release()
    orb = cv2.ORB_create()
    bf = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True)
    h, w = frames[0].shape[:2]
    corners = np.float32([[0, 0], [w, 0], [w, h], [0, h]]).reshape(-1, 1, 2)
    kept = [0]
    prev_kp, prev_des = orb.detectAndCompute(cv2.cvtColor(frames[0], cv2.COLOR_BGR2GRAY), None)
    for t in range(1, len(frames)):
        kp, des = orb.detectAndCompute(cv2.cvtColor(frames[t], cv2.COLOR_BGR2GRAY), None)
        new_key = True
        if prev_des is not None and des is not None:
            matches = bf.match(prev_des, des)
            if len(matches) > 10:
                src = np.float32([prev_kp[m.queryIdx].pt for m in matches]).reshape(-1, 1, 2)
                dst = np.float32([kp[m.trainIdx].pt for m in matches]).reshape(-1, 1, 2)
                m, _ = cv2.findHomography(dst, src, cv2.RANSAC, 5.0)
                if m is not None:
                    warped = cv2.perspectiveTransform(corners, m)
                    a, b = np.zeros((h, w), np.uint8), np.zeros((h, w), np.uint8)
                    cv2.fillPoly(a, np.int32([corners.reshape(-1, 2)]), 1)
                    cv2.fillPoly(b, np.int32([warped.reshape(-1, 2)]), 1)
                    new_key = np.sum(cv2.bitwise_and(a, b)) / (w * h) < 0.5
        if new_key:
            kept.append(t)
            prev_kp, prev_des = kp, des
    if kept[-1] != len(frames) - 1:
        kept.append(len(frames) - 1)
    if len(kept) < 4:
        kept = constrained_sampling(list(range(len(frames))), 4)
    elif len(kept) > 32:
        kept = constrained_sampling(kept, 32)
    for k in kept:
        cv2.imencode(".jpg", frames[k], [cv2.IMWRITE_JPEG_QUALITY, 90])
    return len(kept)


def constrained_sampling(items: list[int], m: int) -> list[int]:
    if len(items) <= m:
        return items
    step = (len(items) - 2) / (m - 2)
    return [items[0], *[items[int(round(i * step)) + 1] for i in range(m - 2)], items[-1]]


def timed(fn, *args) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def peak_mb(fn, *args) -> float:
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", type=float, default=60.0, help="seconds of the short video")
    ap.add_argument("--long", type=float, default=180.0, help="seconds of the long video")
    ap.add_argument("--sizes", default="640x360,1280x720")
    ap.add_argument("--folder", type=Path, default=None, help="keep the videos here (default: temporary)")
    args = ap.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="kf-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    cfg = KeyframeConfig()
    print(f"OpenCV {cv2.__version__}, {cv2.getNumThreads()} threads, {os.cpu_count()} cores; videos in {folder}")
    rows = []
    try:
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.split("x"))
            for label, secs in (("short", args.short), ("long", args.long)):
                path = folder / f"{w}x{h}_{int(secs)}s.mp4"
                if not path.exists():
                    t, _ = timed(make_video, path, secs, w, h)
                    print(f"generated {path.name} in {t:.1f} s", flush=True)
                t_dec, n = timed(decode_only, path)
                t_ours, res = timed(extract_keyframes, path, cfg)
                t_orig, n_orig = timed(original_approach, path)
                mem_ours = peak_mb(extract_keyframes, path, cfg)
                mem_orig = peak_mb(original_approach, path)
                rows.append((f"{w}x{h} {label} ({secs:.0f} s)", n, n / t_dec, n / t_ours, t_dec / t_ours,
                             n / t_orig, t_orig / t_ours, t_orig / t_dec, mem_ours, mem_orig, len(res), n_orig))
                print(f"done {path.name}", flush=True)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    head = ("video", "frames", "decode f/s", "ours f/s", "ours/decode", "orig f/s", "speed-up", "ceiling",
            "ours peak MB", "orig peak MB", "ours kf", "orig kf")
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.0f} | {r[3]:.0f} | {r[4]:.2f}x | {r[5]:.0f} | {r[6]:.1f}x | "
              f"{r[7]:.1f}x | {r[8]:.1f} | {r[9]:.1f} | {r[10]} | {r[11]} |")


if __name__ == "__main__":
    main()
