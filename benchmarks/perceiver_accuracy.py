"""The demo perceiver's accuracy on synthetic clips it was not trained on, against the
untrained tiny VLM of the same size, and what training it costs.

Run:  python benchmarks/perceiver_accuracy.py [--clips 16] [--steps N] [--home DIR]

Trains the perceiver as the demo does (or finds it cached in the home), then, in the same
process, reads ``--clips`` held-out clips (seeds apart from the training clips and from the
demo benchmark) through the perception stage's prompts, the transformers backend and the
stage's parser, with the trained and with the untrained model. Prints the share of frame
pairs whose action is named right, the recall of the objects truly in view (the share of
them named) and the precision of the objects named (the share of them truly in view), the
replies' length, and the training time with the load average it ran under.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clips", type=int, default=16, help="held-out clips (half flights, half rooms)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the demo's)")
    parser.add_argument("--home", help="EMBODIED_R_HOME for the trained model (default: the current one)")
    args = parser.parse_args()
    if args.home:
        os.environ["EMBODIED_R_HOME"] = args.home

    from embodied_r.backends.tiny_models import ensure_tiny_vlm, home
    from embodied_r.perception.perceiver import PerceiverTraining, ensure_perceiver, guess_levels, measure

    cfg = PerceiverTraining() if args.steps is None else PerceiverTraining(steps=args.steps)
    load_before = os.getloadavg()
    started = time.perf_counter()
    trained = ensure_perceiver(cfg=cfg)
    ready = time.perf_counter() - started
    load_after = os.getloadavg()
    report = json.loads((trained / "perceiver_training.json").read_text())
    untrained = ensure_tiny_vlm(home() / "models", cfg.spec)
    rows = []
    for name, folder in (("untrained", untrained), ("trained", trained)):
        t = time.perf_counter()
        scores = measure(folder, clips=args.clips)
        rows.append((name, scores, time.perf_counter() - t))
    print(f"perceiver {trained}")
    print(f"  training: {report['items']} calls, {report['steps']} steps of {cfg.batch_size}, "
          f"{report['train_seconds']:.1f} s (data {report['data_seconds']:.1f} s; "
          f"this run {'trained it' if ready > 5 else 'found it cached'} in {ready:.1f} s), "
          f"loss {report['first_loss']:.2f} -> {report['last_loss']:.2f}")
    if ready > 5:
        print(f"  load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} "
              f"on {os.cpu_count()} cores")
    print(f"  held-out: {args.clips} clips, {rows[0][1]['pairs']} frame pairs, {rows[0][1]['frames']} frames")
    print(f"  {'model':10s} {'actions':>8s} {'obj-rec':>8s} {'obj-prec':>8s} {'tokens':>7s} {'seconds':>8s}")
    for name, scores, seconds in rows:
        print(f"  {name:10s} {scores['action_accuracy']:8.3f} {scores['object_recall']:8.3f} "
              f"{scores['object_precision']:8.3f} {scores['reply_tokens']:7.1f} {seconds:8.1f}")
    print(f"  trained {guess_levels(rows[1][1])}")
    print(f"  example reply (trained): {rows[1][1]['example']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
