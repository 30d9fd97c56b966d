"""Join, from another node, each multi-node trainer launch that the main node's train stage makes.

    python infra/training/follow_launches.py --machine-rank 1 [--stages DIR] [--once]

The train stage on the main node writes its trainer's spec (``<name>/<key>.partial/spec.json``)
and then the exact command it runs into the stage's ``train.log`` (a line ``$ ...``). This
watches the stage folders, which both nodes see on their shared filesystem, and runs that
same command here with ``--machine_rank N``: the same interpreter, accelerate config, main
node address and spec, so both nodes' launchers meet at the main node. Launches of a config
for one node are left alone. Every launch made after this started is joined, the three GRPO
stages one after another and a rerun after a crash included; the main node's stage alone
records results, so this keeps no state of its own.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from embodied_r.children import PARENT_PID_ENV  # noqa: E402
from embodied_r.paths import home  # noqa: E402
from embodied_r.training.environment import (LOG_NAME, SPEC_NAME, _child_env, launch_command,  # noqa: E402
                                             read_accelerate_config)
from embodied_r.training.multinode import for_rank  # noqa: E402

LAUNCH = "accelerate.commands.launch"


def launch_lines(log: Path) -> list[list[str]]:
    """Every accelerate launch a stage's log records, oldest first."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    commands = (launch_command(line) for line in text.splitlines())
    return [cmd for cmd in commands if cmd and LAUNCH in cmd]


def machines(cmd: list[str]) -> int:
    """How many nodes the launch's accelerate config spans (1 without one)."""
    if "--config_file" not in cmd:
        return 1
    return int(read_accelerate_config(Path(cmd[cmd.index("--config_file") + 1])).get("num_machines") or 1)


class Follower:
    """Which launches are new: a spec written after this started, once its log holds one
    launch line more than when it was last joined (or first seen)."""

    def __init__(self, root: Path):
        self.root = root
        self.started = time.time()
        # spec -> (its mtime when last joined, the log's launch lines then)
        self.seen: dict[Path, tuple[float, int]] = {
            spec: (spec.stat().st_mtime, len(launch_lines(spec.with_name(LOG_NAME)))) for spec in self.specs()}

    def specs(self) -> list[Path]:
        # <stages>/<stage name>/<key>.partial: two levels, never into a stage's own files.
        return sorted(self.root.glob(f"*/*.partial/{SPEC_NAME}"))

    def next_launch(self) -> tuple[Path, list[str]] | None:
        for spec in self.specs():
            try:
                mtime = spec.stat().st_mtime
            except OSError:  # renamed away as its stage finished
                continue
            last_mtime, lines_then = self.seen.get(spec, (0.0, 0))
            if mtime <= max(last_mtime, self.started - 1):
                continue
            lines = launch_lines(spec.with_name(LOG_NAME))
            if len(lines) <= lines_then:
                continue  # the spec is written; its launch line follows in a moment
            self.seen[spec] = (mtime, len(lines))
            if str(spec) in lines[-1] and machines(lines[-1]) > 1:
                return spec, lines[-1]
        return None


def child_env() -> dict[str, str]:
    # As the stage gives its trainer, without what belongs to the main node: the parent to
    # watch is this node's launcher, and rank 0 alone logs to MLflow.
    env = _child_env(None)
    env.pop(PARENT_PID_ENV, None)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine-rank", type=int, required=True, help="this node's rank (1 for the second node)")
    parser.add_argument("--stages", type=Path, default=None, help="the stage folders (default: $EMBODIED_R_HOME's)")
    parser.add_argument("--poll-s", type=float, default=2.0)
    parser.add_argument("--once", action="store_true", help="join one launch, then stop")
    args = parser.parse_args()
    if args.machine_rank < 1:
        parser.error("--machine-rank: the main node (0) is started by the train stage itself; give 1 or more")
    # The pipeline's stage folders: <home>/stages/<stage name>/<key>.
    follower = Follower(args.stages or home() / "stages")
    print(f"follow: node {args.machine_rank} waiting for trainer launches under {follower.root}", flush=True)
    while True:
        found = follower.next_launch()
        if found is None:
            time.sleep(args.poll_s)
            continue
        spec, cmd = found
        print(f"follow: joining {spec.parent.name} as node {args.machine_rank}", flush=True)
        rc = subprocess.call(for_rank(cmd, args.machine_rank), env=child_env(), cwd=ROOT)
        print(f"follow: {spec.parent.name} ended here with exit code {rc}", flush=True)
        if args.once:
            return rc


if __name__ == "__main__":
    sys.exit(main())
