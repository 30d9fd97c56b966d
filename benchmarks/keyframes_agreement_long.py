"""The fast key-frame mode beside the official rule on long videos, where thinning applies.

Run:  nice python benchmarks/keyframes_agreement_long.py [--lengths 120,180,300 --fps 29.97 --size 640x360]

``benchmarks/keyframes_agreement.py`` compares the two rules on 40-second clips at 30.0 fps,
which rarely pass 32 candidate key frames. Long VSI-Bench scans and UrbanVideo flights do, and
their containers say 29.97 fps (30000/1001), where the official rule steps ``int(fps)`` = 29
source frames and the fast mode ``round(fps)`` = 30. This script renders one motion video per
pattern of ``keyframes_agreement.PATTERNS`` (slow pans, fast turns, flights, still spells) at
the longest length with the project's synthetic generator, the shorter lengths as its
prefixes (one render, so the lengths share their start), and runs on each:

- the official rule without the [4, 32] clamp: its candidate key frames; clamped by the
  official formula (``constrained_sampling``) these are exactly what ``mode: official``
  keeps, since the rule's loop never looks at the clamp;
- the fast mode as recipes run it (clamped, even thinning).

It prints per video the candidate count, both kept counts and the Jaccard overlap of the kept
source-frame indices (|A & B| / |A | B|) and the same overlap with frames paired when at most
0.5 s apart (the two rules sample different grids at 29.97 fps), then the mean overlaps per
length and per candidate-count band. The figures are in docs/fidelity.md.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from keyframes_agreement import PATTERNS, jaccard  # noqa: E402

from embodied_r.keyframes.extract import extract_keyframes
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.official import constrained_sampling  # noqa: E402
from embodied_r.synthetic.world import panorama, pose_at, render, segments_from  # noqa: E402

# Candidate-count bands of the summary: up to the clamp, just past it, well past it.
BANDS = [(0, 32), (33, 48), (49, 64), (65, 96), (97, 10**9)]


def motions_for(pattern: list[tuple[str, float, float]], seconds: float) -> list[tuple[str, float, float]]:
    out, total, i = [], 0.0, 0
    while total < seconds - 1e-9:
        action, dur, rate = pattern[i % len(pattern)]
        dur = min(dur, seconds - total)
        out.append((action, dur, rate))
        total += dur
        i += 1
    return out


def render_prefixes(folder: Path, index: int, lengths: list[float], fps: float, seed: int,
                    width: int, height: int) -> dict[float, Path]:
    """One render of pattern ``index`` at the longest length, written as a clip per length."""
    segs = segments_from(motions_for(PATTERNS[index % len(PATTERNS)], max(lengths)))
    pano = panorama(np.random.default_rng(seed + index), width, indoor=False)
    paths = {s: folder / f"motion{index}_{int(s)}s.mp4" for s in lengths}
    render(pano, [], lambda t: pose_at(segs, t), [(p, round(s * fps)) for s, p in paths.items()],
           fps, width, height)
    return paths


def near_jaccard(a: list[int], b: list[int], fps: float, within: float = 0.5) -> float:
    """Jaccard overlap with frames paired one to one when at most ``within`` seconds apart.
    At 29.97 fps the two rules sample different grids (every 29th and every 30th frame), so
    exact indices meet only at the first and last frame; this asks whether they keep the
    same moments."""
    ta, tb = sorted(i / fps for i in set(a)), sorted(i / fps for i in set(b))
    i = j = pairs = 0
    while i < len(ta) and j < len(tb):
        if abs(ta[i] - tb[j]) <= within:
            pairs, i, j = pairs + 1, i + 1, j + 1
        elif ta[i] < tb[j]:
            i += 1
        else:
            j += 1
    union = len(ta) + len(tb) - pairs
    return pairs / union if union else 1.0


def official_kept(candidates: list[int], path: Path, official: KeyframeConfig) -> list[int]:
    """What ``mode: official`` keeps, from its unclamped candidates."""
    if len(candidates) > official.max_frames:
        return constrained_sampling(candidates, official.max_frames)
    if len(candidates) < official.min_frames:  # the fill rule takes its frames from all samples
        return extract_keyframes(path, official, keep_images=False).indices
    return candidates


def band(n: int) -> str:
    lo, hi = next((lo, hi) for lo, hi in BANDS if lo <= n <= hi)
    return f"{lo}-{hi}" if hi < 10**9 else f">{lo - 1}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="120,180,300", help="video lengths in seconds, comma-separated")
    ap.add_argument("--fps", type=float, default=30000 / 1001, help="frame rate (default 29.97: 30000/1001)")
    ap.add_argument("--patterns", type=int, default=len(PATTERNS), help="motion patterns (one video each)")
    ap.add_argument("--size", default="640x360", help="frame size WxH")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--folder", type=Path, default=None, help="keep the videos here (default: temporary)")
    args = ap.parse_args()
    lengths = sorted(float(s) for s in args.lengths.split(","))
    width, height = (int(v) for v in args.size.split("x"))
    folder = args.folder or Path(tempfile.mkdtemp(prefix="kf-agree-long-"))
    folder.mkdir(parents=True, exist_ok=True)
    fast, official = KeyframeConfig(mode="fast", cross_check=True), KeyframeConfig(mode="official")
    loose = official.model_copy(update={"min_frames": 2, "max_frames": 1_000_000})
    rows = []
    start = time.perf_counter()
    try:
        for i in range(args.patterns):
            for seconds, path in render_prefixes(folder, i, lengths, args.fps, args.seed, width, height).items():
                cand = extract_keyframes(path, loose, keep_images=False)
                kept = official_kept(cand.indices, path, official)
                quick = extract_keyframes(path, fast, keep_images=False)
                rows.append({"video": f"motion {i}", "seconds": seconds, "step": cand.sample_step,
                             "fast_step": quick.sample_step, "samples": cand.n_samples,
                             "candidates": len(cand), "official": len(kept), "fast": len(quick),
                             "j": jaccard(quick.indices, kept),
                             "jn": near_jaccard(quick.indices, kept, cand.fps)})
                print(f"done motion {i} {seconds:.0f} s", flush=True)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"\n{width}x{height} at {args.fps:.3f} fps; official step {rows[0]['step']} frames, fast step "
          f"{rows[0]['fast_step']}; {time.perf_counter() - start:.0f} s in all\n")
    head = ["video", "length (s)", "1-fps samples", "candidates", "official kf", "fast kf", "Jaccard",
            "Jaccard within 0.5 s"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print(f"| {r['video']} | {r['seconds']:.0f} | {r['samples']} | {r['candidates']} | {r['official']} | "
              f"{r['fast']} | {r['j']:.3f} | {r['jn']:.3f} |")
    def means(sel: list[dict]) -> str:
        return f"{statistics.fmean(r['j'] for r in sel):.3f} | {statistics.fmean(r['jn'] for r in sel):.3f}"

    print("\n| length (s) | videos | mean candidates | mean Jaccard | within 0.5 s |\n|---|---|---|---|---|")
    for s in lengths:
        sel = [r for r in rows if r["seconds"] == s]
        print(f"| {s:.0f} | {len(sel)} | {statistics.fmean(r['candidates'] for r in sel):.1f} | {means(sel)} |")
    print("\n| candidate key frames | videos | mean Jaccard | within 0.5 s |\n|---|---|---|---|")
    for lo, hi in BANDS:
        sel = [r for r in rows if lo <= r["candidates"] <= hi]
        if sel:
            print(f"| {band(lo)} | {len(sel)} | {means(sel)} |")
    print(f"\nover {len(rows)} videos: mean Jaccard {statistics.fmean(r['j'] for r in rows):.3f}, "
          f"within 0.5 s {statistics.fmean(r['jn'] for r in rows):.3f}")


if __name__ == "__main__":
    main()
