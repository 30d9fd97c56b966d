"""Key-frame extraction speed and memory, against decoding alone and the original approach.

Run:  python benchmarks/keyframes_speed.py [--short 60 --long 180 --sizes 640x360,1280x720]

Synthetic videos (30 fps, slow and fast motion) are generated into a temporary folder. In one
process, each video is timed these ways (best of --repeat runs):
  decode   every frame grab()-ed, nothing else (the floor for any method that must decode)
  ours     embodied_r.keyframes.extract_keyframes with its defaults (JPEGs of kept frames included)
  original the official code (train/conver_format/utils.py of github.com/EmbodiedCity/Embodied-R.code)
           written plainly: every frame read() (decoded and converted), one frame a second kept
           in a list, full-resolution ORB on those kept frames only, cross-check matching,
           overlap from two full-size masks, key frames written as an mp4v video
  sha256   hashing the video file, which the key-frame cache does before extracting
Peak memory is measured in a second pass with tracemalloc (OpenCV's frames are numpy arrays,
so tracemalloc sees them), so the timings are not slowed by tracing. "ceiling" is the
speed-up over the original that a method would reach if it cost nothing beyond grabbing every
frame (original time / decode time): OpenCV must decode every frame of these streams (each
frame depends on the ones before), so no extractor built on it can pass that line.
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
from embodied_r.io import sha256_file  # noqa: E402
from embodied_r.keyframes.extract import KeyframeConfig, extract_keyframes  # noqa: E402
from embodied_r.synthetic.world import write_motion_video  # noqa: E402

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


def original_approach(path: Path) -> tuple[int, int]:
    """The official key-frame code, written plainly; returns the number of key frames, after
    and before the clamp to [4, 32].

    Follows ``train/conver_format/utils.py`` of the official repository
    (github.com/EmbodiedCity/Embodied-R.code): ``downsample_video`` reads every frame with
    ``read()`` and keeps one a second (``int(fps)`` apart, plus the last) in a list, checking
    each index against a Python list; ``extract_keyframes`` runs full-resolution ORB on those
    kept frames only, cross-check matching sorted by distance, a RANSAC homography and the
    overlap from two full-size masks; ``constrained_sampling`` clamps to [4, 32]; the key frames
    are written out as an mp4v video at 1 fps.
    """
    cap = cv2.VideoCapture(str(path))
    frame_count, fps = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), cap.get(cv2.CAP_PROP_FPS)
    keep = list(range(0, frame_count, int(fps)))
    if frame_count - 1 not in keep:
        keep.append(frame_count - 1)
    frames, index = [], 0
    ok, frame = cap.read()
    while ok:
        if index in keep:
            frames.append(frame)
        ok, frame = cap.read()
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
            matches = sorted(bf.match(prev_des, des), key=lambda m: m.distance)
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
    unclamped = len(kept)
    if len(kept) < 4:
        kept = constrained_sampling(list(range(len(frames))), 4)
    elif len(kept) > 32:
        kept = constrained_sampling(kept, 32)
    with tempfile.TemporaryDirectory() as d:
        out = cv2.VideoWriter(str(Path(d) / path.name), cv2.VideoWriter_fourcc(*"mp4v"), 1, (w, h))
        for k in kept:
            out.write(frames[k])
        out.release()
    return len(kept), unclamped


def constrained_sampling(items: list[int], m: int) -> list[int]:
    if len(items) <= m:
        return items
    step = (len(items) - 2) / (m - 2)
    return [items[0], *[items[int(round(i * step)) + 1] for i in range(m - 2)], items[-1]]


def timed(fn, *args, repeat: int = 1) -> tuple[float, float, object]:
    """Best wall-clock and best CPU seconds (all threads of the process) of ``repeat`` runs.

    CPU time counts the work done whatever else the machine is running; wall time is what a
    user waits on an idle machine.
    """
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn(*args)
        wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
    return wall, cpu, out


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
    ap.add_argument("--repeat", type=int, default=2, help="timed runs per method; the best counts")
    ap.add_argument("--folder", type=Path, default=None, help="keep the videos here (default: temporary)")
    args = ap.parse_args()
    folder = args.folder or Path(tempfile.mkdtemp(prefix="kf-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    cfg = KeyframeConfig()
    unclamped = KeyframeConfig(min_frames=2, max_frames=1_000_000)  # the rule alone, no fill or thinning
    print(f"OpenCV {cv2.__version__}, {cv2.getNumThreads()} threads, {os.cpu_count()} cores; videos in {folder}")
    rows = []
    try:
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.split("x"))
            for label, secs in (("short", args.short), ("long", args.long)):
                path = folder / f"{w}x{h}_{int(secs)}s.mp4"
                if not path.exists():
                    t, _, _ = timed(make_video, path, secs, w, h)
                    print(f"generated {path.name} in {t:.1f} s", flush=True)
                r = {"video": f"{w}x{h} {label} ({secs:.0f} s)", "mb": path.stat().st_size / 1e6}
                r["wall_dec"], r["cpu_dec"], r["frames"] = timed(decode_only, path, repeat=args.repeat)
                r["wall_ours"], r["cpu_ours"], res = timed(extract_keyframes, path, cfg, repeat=args.repeat)
                r["wall_orig"], r["cpu_orig"], (r["kf_orig"], r["raw_orig"]) = timed(
                    original_approach, path, repeat=args.repeat)
                r["wall_hash"], r["cpu_hash"], _ = timed(sha256_file, path, repeat=args.repeat)
                r["kf_ours"] = len(res)
                r["raw_ours"] = len(extract_keyframes(path, unclamped, keep_images=False))
                r["mem_ours"], r["mem_orig"] = peak_mb(extract_keyframes, path, cfg), peak_mb(original_approach, path)
                rows.append(r)
                print(f"done {path.name}", flush=True)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    head = ("video", "MB", "frames", "decode f/s", "ours f/s", "ours/decode", "orig f/s", "speed-up", "ceiling",
            "speed-up (wall)", "sha256/ours", "ours peak MB", "orig peak MB", "ours kf", "orig kf",
            "unclamped ours/orig")
    print("\nThroughput and ratios from CPU time; 'speed-up (wall)' from wall-clock time.")
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        n = r["frames"]
        print(f"| {r['video']} | {r['mb']:.1f} | {n} | {n / r['cpu_dec']:.0f} | {n / r['cpu_ours']:.0f} | "
              f"{r['cpu_dec'] / r['cpu_ours']:.2f}x | {n / r['cpu_orig']:.0f} | {r['cpu_orig'] / r['cpu_ours']:.1f}x | "
              f"{r['cpu_orig'] / r['cpu_dec']:.1f}x | {r['wall_orig'] / r['wall_ours']:.1f}x | "
              f"{100 * r['cpu_hash'] / r['cpu_ours']:.1f}% | {r['mem_ours']:.1f} | {r['mem_orig']:.1f} | "
              f"{r['kf_ours']} | {r['kf_orig']} | {r['raw_ours']}/{r['raw_orig']} |")


if __name__ == "__main__":
    main()
