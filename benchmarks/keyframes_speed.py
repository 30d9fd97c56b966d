"""Key-frame extraction speed and memory, against decoding alone and the original approach.

Run:  python benchmarks/keyframes_speed.py [--short 60 --long 180 --sizes 640x360,1280x720]
                                           [--reference main] [--repeat 3] [--target 0.7]
                                           [--variant decode_threads=1 ...]

Synthetic videos (30 fps, slow and fast motion) are generated into a temporary folder. In one
process, each video is timed these ways (best of --repeat runs, the methods taken in turn
within each round so that a change in the machine's load hits them alike):
  decode   every frame grab()-ed, nothing else (the floor for any method that must decode),
           with OpenCV's default FFmpeg threads (one per core) and with one thread; the
           cheaper of the two, in wall-clock and in CPU time separately, is the baseline
  ours     embodied_r.keyframes.extract_keyframes with its defaults (JPEGs of kept frames included)
  original the official code (train/conver_format/utils.py of github.com/EmbodiedCity/Embodied-R.code)
           written plainly: every frame read() (decoded and converted), one frame a second kept
           in a list, full-resolution ORB on those kept frames only, cross-check matching,
           overlap from two full-size masks, key frames written as an mp4v video
  sha256   hashing the video file, which the key-frame cache does before extracting
The first table gives throughput (frames per second of wall-clock time) and the ratios of ours
to decode-only in wall-clock time (what a user waits for; ours decodes ahead in a second thread)
and in CPU time (all threads of the process: the work done, whatever else the machine runs).
A summary says, per video, whether ours reaches --target times decode-only throughput in each
of the two. --variant KEY=VALUE (repeatable) also times ours with that setting changed, in the same
turns, so that a setting is compared with the default under the same load.
"same kf" checks that ours keeps exactly the frames (indices, reasons and overlaps, with and
without the [4, 32] clamp) that the extractor of the git revision --reference keeps; that
revision runs in a subprocess from a `git archive` of it, which also times it against its own
decode-only baseline ("ref" columns). Peak memory is measured in a second pass with tracemalloc
(OpenCV's frames are numpy arrays, so tracemalloc sees them), so the timings are not slowed by
tracing. "ceiling" is the speed-up over the original that a method would reach if it cost
nothing beyond grabbing every frame (original time / decode time): OpenCV must decode every
frame of these streams (each frame depends on the ones before), so no extractor built on it
can pass that line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import cv2
import numpy as np

# KF_BENCH_CODE: run another revision's package (see measure_reference).
sys.path.insert(0, os.environ.get("KF_BENCH_CODE") or str(Path(__file__).resolve().parents[1]))
from embodied_r.io import sha256_file  # noqa: E402
from embodied_r.keyframes.extract import extract_keyframes
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.synthetic.world import write_motion_video  # noqa: E402

# Slow pans, fast turns, flights and still spells: a varied number of key frames per minute.
PATTERN = [("turn right", 4.0, 15.0), ("fly forward", 3.0, 1.15), ("turn left", 2.0, 70.0),
           ("hover", 3.0, 0.0), ("rise", 2.0, 4.0), ("fly backward", 3.0, 1.15),
           ("turn right", 3.0, 40.0), ("descend", 2.0, 4.0), ("turn left", 2.0, 10.0)]
UNCLAMPED = KeyframeConfig(min_frames=2, max_frames=1_000_000)  # the rule alone, no fill or thinning


def make_video(path: Path, seconds: float, width: int, height: int) -> Path:
    motions, total, i = [], 0.0, 0
    while total < seconds:
        action, dur, rate = PATTERN[i % len(PATTERN)]
        dur = min(dur, seconds - total)
        motions.append((action, dur, rate))
        total += dur
        i += 1
    return write_motion_video(path, motions, seed=1, width=width, height=height, fps=30.0)


def decode_only(path: Path, threads: int = 0) -> int:
    cap = (cv2.VideoCapture(str(path), cv2.CAP_ANY, [cv2.CAP_PROP_N_THREADS, threads]) if threads
           else cv2.VideoCapture(str(path)))
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


def in_turns(methods: dict[str, tuple], repeat: int) -> dict[str, tuple[float, float, object]]:
    """Best wall-clock and CPU seconds of each method, the methods run in turn ``repeat`` times."""
    best: dict[str, tuple[float, float, object]] = {k: (math.inf, math.inf, None) for k in methods}
    for _ in range(repeat):
        for name, (fn, *args) in methods.items():
            w0, c0 = time.perf_counter(), time.process_time()
            out = fn(*args)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu), out)
    return best


def selection(res) -> dict:
    return {"indices": res.indices, "reasons": res.reasons,
            "overlaps": [None if math.isnan(o) else o for o in res.overlaps]}


def measure(path: Path, repeat: int, variants: dict[str, dict] | None = None) -> dict:
    """Decode-only (OpenCV's default threads and one thread) and the extractor (with its defaults,
    and with each of ``variants``' settings), timed in turns in this process, and the frames the
    extractor keeps with and without the clamp."""
    variants = variants or {}
    t = in_turns({"dec_default": (decode_only, path), "dec_1": (decode_only, path, 1),
                  "ext": (extract_keyframes, path, KeyframeConfig()),
                  **{f"var {k}": (extract_keyframes, path, KeyframeConfig(**v)) for k, v in variants.items()}},
                 repeat)
    out = {f"{k}_{m}": v[i] for k, v in t.items() for i, m in enumerate(("wall", "cpu"))}
    out["frames"] = t["dec_default"][2]
    out["kf"] = len(t["ext"][2])
    out["variants"] = {k: {"wall": t[f"var {k}"][0], "cpu": t[f"var {k}"][1],
                           "same": selection(t[f"var {k}"][2]) == selection(t["ext"][2])} for k in variants}
    out["selection"] = {"clamped": selection(t["ext"][2]),
                        "unclamped": selection(extract_keyframes(path, UNCLAMPED, keep_images=False))}
    out["load"] = os.getloadavg()[0]
    out["code"] = str(Path(sys.modules[extract_keyframes.__module__].__file__).parents[2])
    return out


def measure_reference(rev: str, paths: list[Path], repeat: int, cv_threads: int) -> dict[str, dict] | None:
    """``measure`` run by the package of git revision ``rev``, in a subprocess."""
    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(root), "archive", rev, "embodied_r"], capture_output=True,
                             check=False)
    if archive.returncode:
        print(f"no reference: git archive {rev}: {archive.stderr.decode().strip()}")
        return None
    with tempfile.TemporaryDirectory(prefix="kf-ref-") as code:
        subprocess.run(["tar", "-x", "-C", code], input=archive.stdout, check=True)
        proc = subprocess.run([sys.executable, __file__, "--measure", *map(str, paths), "--repeat", str(repeat),
                               "--cv-threads", str(cv_threads)],
                              env={**os.environ, "KF_BENCH_CODE": code}, capture_output=True, text=True, check=True)
        out = json.loads(proc.stdout.splitlines()[-1])
    if any(m["code"] != code for m in out.values()):
        raise RuntimeError("the reference subprocess did not import the reference code")
    return out


def ratio(r: dict, wall: float | None = None, cpu: float | None = None) -> tuple[float, float]:
    """Wall-clock and CPU ratio of the extractor (or of the given times) to the cheaper
    decode-only run (each separately)."""
    return (min(r["dec_default_wall"], r["dec_1_wall"]) / (wall or r["ext_wall"]),
            min(r["dec_default_cpu"], r["dec_1_cpu"]) / (cpu or r["ext_cpu"]))


def parse_variant(text: str) -> tuple[str, dict]:
    key, _, value = text.partition("=")
    setting = {key: None if value.lower() in ("none", "null") else json.loads(value)}
    KeyframeConfig(**setting)  # refuse an unknown or invalid setting before any timing
    return text, setting


def print_target(rows: list[dict], target: float) -> None:
    """Whether each video reaches ``target`` times decode-only throughput, wall-clock and CPU."""
    print(f"\nTarget: {target:.2f}x of decode-only throughput (the ratios above).")
    met = {"wall": 0, "CPU": 0}
    for r in rows:
        words = []
        for kind, value in zip(met, ratio(r)):
            met[kind] += value >= target
            words.append(f"{kind} {value:.3f}x {'reaches it' if value >= target else 'MISSES it'}")
        print(f"  {r['video']} (load {r['load']:.1f}): " + ", ".join(words))
    print("  " + "; ".join(f"{kind}: {n} of {len(rows)} videos reach it" for kind, n in met.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", type=float, default=60.0, help="seconds of the short video")
    ap.add_argument("--long", type=float, default=180.0, help="seconds of the long video")
    ap.add_argument("--sizes", default="640x360,1280x720")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per method; the best counts")
    ap.add_argument("--folder", type=Path, default=None, help="keep the videos here (default: temporary)")
    ap.add_argument("--reference", default="main",
                    help="git revision whose extractor must keep the same frames ('' to skip)")
    ap.add_argument("--no-original", action="store_true", help="skip the original approach and sha256")
    ap.add_argument("--cv-threads", type=int, default=None,
                    help="OpenCV threads (default: what the key-frame stage gives one video on this machine)")
    ap.add_argument("--target", type=float, default=0.7, help="ratio to decode-only each video should reach")
    ap.add_argument("--variant", action="append", type=parse_variant, default=[], metavar="KEY=VALUE",
                    help="also time ours with this setting (JSON value, or none), in the same turns")
    ap.add_argument("--measure", nargs="+", type=Path, help=argparse.SUPPRESS)  # the reference subprocess
    args = ap.parse_args()
    if args.cv_threads is None:
        from embodied_r.keyframes.stage import opencv_threads

        args.cv_threads = opencv_threads(KeyframeConfig(), workers=1, cores=os.cpu_count() or 1)
    cv2.setNumThreads(args.cv_threads)  # the reference revision runs with the same setting
    if args.measure:
        print(json.dumps({str(p): measure(p, args.repeat) for p in args.measure}))
        return
    folder = args.folder or Path(tempfile.mkdtemp(prefix="kf-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    cfg = KeyframeConfig()
    print(f"OpenCV {cv2.__version__}, {cv2.getNumThreads()} threads, {os.cpu_count()} cores; videos in {folder}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows, ref = [], None
    try:
        for size in args.sizes.split(","):
            w, h = (int(v) for v in size.split("x"))
            for label, secs in (("short", args.short), ("long", args.long)):
                path = folder / f"{w}x{h}_{int(secs)}s.mp4"
                if not path.exists():
                    t, _, _ = timed(make_video, path, secs, w, h)
                    print(f"generated {path.name} in {t:.1f} s", flush=True)
                r = {"video": f"{w}x{h} {label} ({secs:.0f} s)", "path": str(path), "mb": path.stat().st_size / 1e6,
                     **measure(path, args.repeat, dict(args.variant))}
                if not args.no_original:
                    r["wall_orig"], r["cpu_orig"], (r["kf_orig"], r["raw_orig"]) = timed(
                        original_approach, path, repeat=args.repeat)
                    r["wall_hash"], r["cpu_hash"], _ = timed(sha256_file, path, repeat=args.repeat)
                    r["mem_orig"] = peak_mb(original_approach, path)
                r["raw_ours"] = len(r["selection"]["unclamped"]["indices"])
                r["mem_ours"] = peak_mb(extract_keyframes, path, cfg)
                rows.append(r)
                print(f"done {path.name} (load average {r['load']:.2f})", flush=True)
        if args.reference:
            ref = measure_reference(args.reference, [Path(r["path"]) for r in rows], args.repeat, args.cv_threads)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\nOurs against decode-only in this process: wall = frames per wall-clock second, cpu = CPU seconds "
          "of all threads; the baseline is the cheaper decode (OpenCV's default FFmpeg threads or one).")
    head = ("video", "frames", "load", "decode wall s (default/1t)", "decode CPU s (default/1t)", "ours wall s",
            "ours CPU s", "decode f/s", "ours f/s", "wall ratio", "CPU ratio", "CPU ratio to default decode",
            f"{args.reference or 'ref'} wall ratio", f"{args.reference or 'ref'} CPU ratio", "same kf")
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        n, (wr, cr) = r["frames"], ratio(r)
        b = ref.get(r["path"]) if ref else None
        same = "-" if b is None else "yes" if b["selection"] == r["selection"] else "NO"
        rw, rc = ("-", "-") if b is None else (f"{ratio(b)[0]:.2f}x", f"{ratio(b)[1]:.2f}x")
        dec_wall = min(r["dec_default_wall"], r["dec_1_wall"])
        print(f"| {r['video']} | {n} | {r['load']:.1f} | {r['dec_default_wall']:.3f}/{r['dec_1_wall']:.3f} | "
              f"{r['dec_default_cpu']:.3f}/{r['dec_1_cpu']:.3f} | {r['ext_wall']:.3f} | {r['ext_cpu']:.3f} | "
              f"{n / dec_wall:.0f} | {n / r['ext_wall']:.0f} | {wr:.2f}x | {cr:.2f}x | "
              f"{r['dec_default_cpu'] / r['ext_cpu']:.2f}x | {rw} | {rc} | {same} |")
    if args.variant:
        print("\nOurs with one setting changed, timed in the same turns (same kf: against ours with the defaults).")
        head = ("video", "setting", "wall s", "CPU s", "wall ratio", "CPU ratio", "same kf")
        print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for r in rows:
            for name, v in r["variants"].items():
                wr, cr = ratio(r, v["wall"], v["cpu"])
                print(f"| {r['video']} | {name} | {v['wall']:.3f} | {v['cpu']:.3f} | {wr:.2f}x | {cr:.2f}x | "
                      f"{'yes' if v['same'] else 'NO'} |")
    print_target(rows, args.target)
    if args.no_original:
        return
    head = ("video", "MB", "orig f/s", "speed-up", "ceiling", "speed-up (wall)", "sha256/ours", "ours peak MB",
            "orig peak MB", "ours kf", "orig kf", "unclamped ours/orig")
    print("\nAgainst the original approach; throughput and ratios from CPU time, 'speed-up (wall)' from wall-clock.")
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        n, dec_cpu = r["frames"], min(r["dec_default_cpu"], r["dec_1_cpu"])
        print(f"| {r['video']} | {r['mb']:.1f} | {n / r['cpu_orig']:.0f} | {r['cpu_orig'] / r['ext_cpu']:.1f}x | "
              f"{r['cpu_orig'] / dec_cpu:.1f}x | {r['wall_orig'] / r['ext_wall']:.1f}x | "
              f"{100 * r['cpu_hash'] / r['ext_cpu']:.1f}% | {r['mem_ours']:.1f} | {r['mem_orig']:.1f} | "
              f"{r['kf']} | {r['kf_orig']} | {r['raw_ours']}/{r['raw_orig']} |")


if __name__ == "__main__":
    main()
