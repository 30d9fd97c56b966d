"""The GPU recipes rehearsed on a CPU with their real engines (``make rehearse``), in the
rehearsal environment on the ``rehearsal`` recipe: each item runs for real and prints one line,
its verdict and its figures (docs/testing.md lists them)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from embodied_r.backends.cpu_adapters import INSTALLED_ENV
from embodied_r.checks import rehearse_launches
from embodied_r.checks.rehearse_run import Rehearsal
from embodied_r.checks.steps import finish_check
from embodied_r.checks.rehearse_verdicts import Failed
from embodied_r.training.environment import PROJECT_ROOT


ITEMS = ("serve", "perception", "zero3", "evaluate", "colocate", "peer-sft", "two-nodes", "pool")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=None, help="work folder (default: a new temporary one, removed after)")
    parser.add_argument("--plant", choices=["restart-at-zero"], default=None,
                        help="plant a fault the zero3 item must catch: a resume that restarts at step 0")
    parser.add_argument("--base-python", default=str(PROJECT_ROOT / ".venv" / "bin" / "python"),
                        help="the project's environment (the Prefect server of the pool item)")
    args = parser.parse_args()
    if os.environ.get(INSTALLED_ENV) != "1":
        parser.exit(2, f"rehearse: {sys.executable} is not the training environment's CPU replica (its CPU adapters are "
                       "not installed): run `make rehearse` or `bash infra/training/rehearse.sh`\n")
    started = time.monotonic()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="rehearse-"))
    work.mkdir(parents=True, exist_ok=True)
    r = Rehearsal(work, args.base_python, args.plant)
    lines: dict[str, tuple[bool, str]] = {}

    def item(name: str, step: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        try:
            value = step()
        except Exception as exc:  # noqa: BLE001 - every failure is the item's verdict
            text = str(exc) if isinstance(exc, Failed) else f"{type(exc).__name__}: {exc}"
            lines[name] = (False, f"{text} [{time.monotonic() - t0:.0f} s]")
            return None
        return value

    def say(name: str, ok: bool, text: str) -> None:
        lines[name] = (ok, text)
        print(f"rehearse: {name:<10} {'ok  ' if ok else 'FAIL'} {text}", flush=True)

    print(f"rehearse: {sys.executable} ({work})", flush=True)
    # The reference server starts beside the pipeline's first stages: it is first asked in stage 3.
    with ThreadPoolExecutor(1) as pool:
        serving = pool.submit(item, "serve", r.start_reference)
        triple = item("zero3", r.pipeline)
        serve_up = serving.result()
    if triple:
        say("perception", True, triple[0])
        say("zero3", True, triple[1])
        say("evaluate", True, triple[2])
    else:
        for name in ("perception", "zero3", "evaluate"):
            ok, text = lines.get("zero3", lines.get("serve", (False, "not run")))
            say(name, False, text if name == "zero3" else f"not measured: the pipeline failed ({text[:200]})")
    for name, step in (("colocate", lambda: rehearse_launches.colocate(r)), ("peer-sft", lambda: rehearse_launches.peer_sft(r)),
                       ("two-nodes", lambda: rehearse_launches.two_nodes(r)), ("pool", lambda: rehearse_launches.pool(r))):
        value = item(name, step)
        say(name, value is not None, value if value is not None else lines[name][1])
    if serve_up:
        stopped = item("serve-stop", r.stop_reference)
        say("serve", stopped is not None, f"vllm serve via serve-reference.sh {serve_up}; "
            + (stopped or lines["serve-stop"][1]))
    else:
        say("serve", False, lines["serve"][1])
    passed = sum(ok for name, (ok, _) in lines.items() if name in ITEMS)
    failed = len(ITEMS) - passed
    return finish_check("rehearse", "rehearse", time.monotonic() - started, work / "logs", work, bool(args.work),
                        passed, failed)


if __name__ == "__main__":
    sys.exit(main())
