"""How far the fast key-frame mode's choice agrees with the official rule.

Run:  python benchmarks/keyframes_agreement.py [--urban 8 --vsi 4 --motion 4 --seconds 40 --size 1280x720]
      python benchmarks/keyframes_agreement.py --videos DIR    # your own videos (*.mp4 under DIR) instead
      python benchmarks/keyframes_agreement.py --fast cross_check=true   # change the fast mode's settings

Videos come from the project's synthetic generator (``embodied_r.synthetic``): UrbanVideo-style
flights (one clip per scene), VSI-style room scans, and motion clips that string slow pans, fast
turns, flights and still spells together. Each video goes through
``extract_keyframes`` twice, with ``mode: fast`` and ``mode: official`` and otherwise the
same settings (1 fps, overlap below 0.5, 4 to 32 frames). Per video it prints the Jaccard
overlap of the two sets of source-frame indices (|A & B| / |A | B|), the two counts and their
difference (fast - official), and the mean Jaccard over all videos; with --unclamped also the
rule alone, before the [4, 32] clamp. The `paper` and `official-script` recipes use the official
mode; `improved` uses the fast one, whose agreement this measures.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from embodied_r.keyframes.extract import extract_keyframes
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.synthetic.config import SyntheticConfig  # noqa: E402
from embodied_r.synthetic.generate import make_synthetic_benchmark  # noqa: E402
from embodied_r.synthetic.world import write_motion_video  # noqa: E402

THRESHOLD = 0.8
PATTERNS = [
    [("turn right", 4.0, 15.0), ("fly forward", 3.0, 1.15), ("turn left", 2.0, 70.0), ("hover", 3.0, 0.0),
     ("rise", 2.0, 4.0), ("fly backward", 3.0, 1.15), ("turn right", 3.0, 40.0), ("descend", 2.0, 4.0)],
    [("fly forward", 6.0, 1.1), ("turn left", 3.0, 20.0), ("fly forward", 6.0, 1.1), ("turn right", 3.0, 30.0)],
    [("turn left", 10.0, 8.0), ("hover", 2.0, 0.0), ("turn right", 10.0, 12.0)],
    [("rise", 4.0, 6.0), ("turn right", 2.0, 90.0), ("fly forward", 4.0, 1.3), ("descend", 4.0, 6.0)],
]


def jaccard(a: list[int], b: list[int]) -> float:
    sa, sb = set(a), set(b)
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def motion_video(path: Path, pattern: list[tuple[str, float, float]], seconds: float, seed: int,
                 width: int, height: int) -> Path:
    motions, total, i = [], 0.0, 0
    while total < seconds:
        action, dur, rate = pattern[i % len(pattern)]
        dur = min(dur, seconds - total)
        motions.append((action, dur, rate))
        total += dur
        i += 1
    return write_motion_video(path, motions, seed=seed, width=width, height=height, fps=30.0)


def videos(folder: Path, args: argparse.Namespace, width: int, height: int) -> list[tuple[str, Path]]:
    cfg = SyntheticConfig(seed=args.seed, urban_videos=args.urban, clips_per_scene=1, vsi_scenes=args.vsi,
                          seconds=args.seconds, width=width, height=height)
    make_synthetic_benchmark(folder, cfg)
    out = [(f"urban {p.stem[:28]}", p) for p in sorted((folder / "UrbanVideo-Bench" / "videos").glob("*.mp4"))]
    scans = folder / "vsi-videos"
    for archive in sorted((folder / "VSI-Bench").glob("*.zip")):
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if name.endswith(".mp4"):
                    zf.extract(name, scans)
                    out.append((f"vsi {Path(name).stem[:30]}", scans / name))
    for i in range(args.motion):
        path = motion_video(folder / f"motion_{i}.mp4", PATTERNS[i % len(PATTERNS)], args.seconds, args.seed + i,
                            width, height)
        out.append((f"motion {i}", path))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urban", type=int, default=8, help="UrbanVideo-style clips")
    ap.add_argument("--vsi", type=int, default=4, help="VSI-style room scans")
    ap.add_argument("--motion", type=int, default=4, help="motion clips")
    ap.add_argument("--seconds", type=float, default=40.0, help="length of each video")
    ap.add_argument("--size", default="1280x720", help="frame size WxH")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--unclamped", action="store_true", help="also compare the rule alone, before the clamp")
    ap.add_argument("--folder", type=Path, default=None, help="keep the videos here (default: temporary)")
    ap.add_argument("--videos", type=Path, default=None, help="compare on the *.mp4 files under this folder")
    ap.add_argument("--fast", action="append", default=[], metavar="KEY=VALUE",
                    help="a KeyframeConfig setting of the fast mode (repeatable), e.g. cross_check=true")
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    folder = args.folder or Path(tempfile.mkdtemp(prefix="kf-agree-"))
    folder.mkdir(parents=True, exist_ok=True)
    overrides = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.fast)}
    fast, official = KeyframeConfig(mode="fast", **overrides), KeyframeConfig(mode="official")
    loose = {"min_frames": 2, "max_frames": 1_000_000}
    rows = []
    try:
        if args.videos is not None:
            found = [(p.name[:40], p) for p in sorted(args.videos.rglob("*.mp4"))]
        elif (folder / "UrbanVideo-Bench").is_dir():  # a kept --folder: the videos are there already
            urban = sorted((folder / "UrbanVideo-Bench" / "videos").glob("*.mp4"))
            found = [(f"urban {p.stem[:28]}", p) for p in urban]
            found += [(f"vsi {p.stem[:30]}", p) for p in sorted((folder / "vsi-videos").rglob("*.mp4"))]
            found += [(f"motion {p.stem[7:]}", p) for p in sorted(folder.glob("motion_*.mp4"))]
        else:
            found = videos(folder, args, width, height)
        for label, path in found:
            a = extract_keyframes(path, fast, keep_images=False)
            b = extract_keyframes(path, official, keep_images=False)
            row = {"video": label, "fast": a.indices, "official": b.indices, "j": jaccard(a.indices, b.indices),
                   "samples": b.n_samples}
            if args.unclamped:
                ua = extract_keyframes(path, fast.model_copy(update=loose), keep_images=False)
                ub = extract_keyframes(path, official.model_copy(update=loose), keep_images=False)
                row.update(ju=jaccard(ua.indices, ub.indices), nua=len(ua), nub=len(ub))
            rows.append(row)
            print(f"done {label}", flush=True)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    head = ["video", "1-fps samples", "fast kf", "official kf", "difference", "Jaccard"]
    if args.unclamped:
        head += ["unclamped fast/official", "unclamped Jaccard"]
    where = f"videos under {args.videos}" if args.videos else f"{width}x{height}, {args.seconds:.0f} s each"
    print(f"\n{where}; fast mode settings: {overrides or 'defaults'}\n")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        cells = [r["video"], str(r["samples"]), str(len(r["fast"])), str(len(r["official"])),
                 f"{len(r['fast']) - len(r['official']):+d}", f"{r['j']:.3f}"]
        if args.unclamped:
            cells += [f"{r['nua']}/{r['nub']}", f"{r['ju']:.3f}"]
        print("| " + " | ".join(cells) + " |")
    mean = statistics.fmean(r["j"] for r in rows)
    mean_diff = statistics.fmean(len(r["fast"]) - len(r["official"]) for r in rows)
    mean_abs = statistics.fmean(abs(len(r["fast"]) - len(r["official"])) for r in rows)
    print(f"\nmean Jaccard {mean:.3f} over {len(rows)} videos; count difference (fast - official): "
          f"mean {mean_diff:+.2f}, mean absolute {mean_abs:.2f}")
    if args.unclamped:
        print(f"unclamped mean Jaccard {statistics.fmean(r['ju'] for r in rows):.3f}")
    verdict = "below" if mean < THRESHOLD else "at or above"
    print(f"agreement {verdict} {THRESHOLD}: on these videos the fast mode "
          f"{'chooses other frames than' if mean < THRESHOLD else 'stands in for'} the official rule")


if __name__ == "__main__":
    main()
