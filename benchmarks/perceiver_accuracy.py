"""The demo perceiver's accuracy on synthetic clips it was not trained on, against the
untrained tiny VLM of the same size, and what training it costs.

Run:  python benchmarks/perceiver_accuracy.py [--clips 16] [--steps N] [--home DIR]

Trains the perceiver as the demo does (or finds it cached in the home), then, in the same
process, reads ``--clips`` held-out clips (seeds apart from the training clips and from the
demo benchmark) through the perception stage's prompts, the transformers backend and the
stage's parser, with the trained and with the untrained model. Prints the share of frame
pairs whose action is named right and the share of objects named right (of the objects in
view or named, those both in view and named), and the training time.
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
    from embodied_r.perception.perceiver import PerceiverTraining, ensure_perceiver, measure

    cfg = PerceiverTraining() if args.steps is None else PerceiverTraining(steps=args.steps)
    started = time.perf_counter()
    trained = ensure_perceiver(cfg=cfg)
    ready = time.perf_counter() - started
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
    print(f"  held-out: {args.clips} clips, {rows[0][1]['pairs']} frame pairs, {rows[0][1]['frames']} frames")
    print(f"  {'model':10s} {'actions':>8s} {'objects':>8s} {'seconds':>8s}")
    for name, scores, seconds in rows:
        print(f"  {name:10s} {scores['action_accuracy']:8.3f} {scores['object_accuracy']:8.3f} {seconds:8.1f}")
    print(f"  example reply (trained): {rows[1][1]['example']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
