"""``embodied-r check gpu``: the GPU-marked tests, then each GPU check in a process of its own,
as a table; and ``embodied-r check memory``, each recipe's estimated GPU memory.

Each check has its own process so that a CUDA error in one fails its own row and no other."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from embodied_r.checks.steps import SCHEDULES

# Set for the GPU-marked tests run from here: the test that runs this whole check skips.
INSIDE = "EMBODIED_R_IN_GPU_CHECK"
CHECKS: dict[str, str] = {
    "backend": "transformers backend, device auto: tiny LM, tiny VLM with an image",
    "grpo-stage1": f"GRPO stage 1 ({SCHEDULES['stage1']}), tiny LM, 1 step",
    "grpo-stage2": f"GRPO stage 2 ({SCHEDULES['stage2']}), tiny LM, 1 step",
    "grpo-stage3": f"GRPO stage 3 ({SCHEDULES['stage3']}), tiny reference asked",
    "sft": "SFT, tiny LM, 1 step",
    "accelerate": "GRPO stage 1 under accelerate launch, 1 process",
    "colocate": "GRPO stage 1, colocated vLLM rollouts, weights checked after each sync",
    "policy": "GRPO steps of the recipe's policy at its settings",
}
TIMEOUTS = {"policy": 1800}
DEFAULT_TIMEOUT = 900
TESTS_TIMEOUT = 1800


@dataclass
class Row:
    name: str
    what: str
    status: str  # passed, failed or skipped
    detail: str = ""
    seconds: float | None = None


def rows_from_junit(path: Path) -> list[Row]:
    rows = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        name = f"{module}.py::{case.get('name')}" if module else str(case.get("name"))
        seconds = float(case.get("time") or 0)
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if failed is not None:
            rows.append(Row(name, "test", "failed", " ".join((failed.get("message") or "").split())[:300], seconds))
        elif skipped is not None:
            rows.append(Row(name, "test", "skipped", (skipped.get("message") or "").strip(), seconds))
        else:
            rows.append(Row(name, "test", "passed", "", seconds))
    return rows


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def run_gpu_tests(work: Path) -> list[Row]:
    tests = project_root() / "tests"
    if not tests.is_dir():
        return [Row("gpu-tests", "tests", "skipped", "no tests/ folder here: run from a source checkout")]
    if importlib.util.find_spec("pytest") is None:
        return [Row("gpu-tests", "tests", "skipped", f"pytest is not installed in {sys.executable} "
                    "(pip install pytest pytest-timeout; infra/install-env.sh train installs them)")]
    report = work / "gpu-tests.xml"
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
           str(tests)]
    try:
        done = subprocess.run(cmd, cwd=project_root(), env={**os.environ, INSIDE: "1"}, capture_output=True,
                              text=True, timeout=TESTS_TIMEOUT)
    except subprocess.TimeoutExpired:
        return [Row("gpu-tests", "tests", "failed", f"still running after {TESTS_TIMEOUT} s",
                    round(time.monotonic() - started, 1))]
    if not report.is_file():
        tail = " ".join((done.stdout + done.stderr).split())[-300:]
        return [Row("gpu-tests", "tests", "failed", f"pytest exited {done.returncode}: {tail}",
                    round(time.monotonic() - started, 1))]
    return rows_from_junit(report) or [Row("gpu-tests", "tests", "skipped", "none collected")]


def check_env() -> dict[str, str]:
    """This checkout first on the path, the hub offline: a policy's weights are used where
    they are, never downloaded."""
    path = os.pathsep.join(p for p in (str(project_root()), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_check(name: str, spec: dict[str, Any], work: Path) -> Row:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    spec_file, out_file = folder / "spec.json", folder / "result.json"
    spec_file.write_text(json.dumps({**spec, "work": str(folder)}))
    timeout = TIMEOUTS.get(name, DEFAULT_TIMEOUT)
    started = time.monotonic()
    cmd = [sys.executable, "-m", "embodied_r.checks.gpu", "--one", name, str(spec_file), str(out_file)]
    with open(folder / "check.log", "w") as log:
        try:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=check_env()).returncode
        except subprocess.TimeoutExpired:
            code = None
    seconds = round(time.monotonic() - started, 1)
    if not out_file.is_file():
        why = f"still running after {timeout} s" if code is None else f"exited {code} without a result"
        tail = " ".join((folder / "check.log").read_text(errors="replace").split())[-300:]
        return Row(name, CHECKS[name], "failed", f"{why}; {tail} (log: {folder / 'check.log'})", seconds)
    result = json.loads(out_file.read_text())
    if result.get("skipped"):
        return Row(name, CHECKS[name], "skipped", result["skipped"], seconds)
    detail = result.get("detail", "")
    if not result.get("ok"):
        detail += f" (log: {folder / 'check.log'})"
    return Row(name, CHECKS[name], "passed" if result.get("ok") else "failed", detail, seconds)


def table(rows: list[Row]) -> str:
    cells = [("check", "result", "seconds", "detail")]
    for row in rows:
        result = {"passed": "ok", "failed": "FAILED", "skipped": "skipped"}[row.status]
        seconds = "" if row.seconds is None else f"{row.seconds:.1f}"
        cells.append((row.name, result, seconds, row.detail or (row.what if row.what != "test" else "")))
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    return "\n".join(f"{c[0]:<{widths[0]}}  {c[1]:<{widths[1]}}  {c[2]:>{widths[2]}}  {c[3]}".rstrip() for c in cells)


def closing(rows: list[Row]) -> str:
    passed = sum(r.status == "passed" for r in rows)
    failed = sum(r.status == "failed" for r in rows)
    return f"gpu-check: {passed} passed, {failed} failed"


def resolve_device(device: str) -> str | None:
    """``cuda`` or ``cpu`` for the checks, or None: no GPU here, so nothing runs."""
    if device == "cpu":
        return "cpu"
    from embodied_r.backends.devices import cuda_available

    return "cuda" if cuda_available() else None


def run(device: str = "auto", recipe: str = "paper", only: list[str] | None = None, tests: bool = True,
        work: Path | None = None, say: Callable[[str], None] = print, **policy: Any) -> list[Row]:
    """``policy``: the policy step's ``steps``, ``prompt_tokens``, ``completion_tokens`` and
    ``policy_shape``."""
    names = only or list(CHECKS)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; the checks are {', '.join(CHECKS)}")
    chosen = resolve_device(device)
    if chosen is None:
        why = "no GPU (torch sees no CUDA device)"
        rows = ([Row("gpu-tests", "tests", "skipped", why)] if tests else []) + [
            Row(n, CHECKS[n], "skipped", why) for n in names]
        for row in rows:
            say(f"  skipped  {row.name}: {why}")
        return rows
    keep = work is not None
    work = Path(work) if work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    if tests and chosen == "cuda":
        say("  GPU-marked tests ...")
        for row in run_gpu_tests(work):
            rows.append(row)
            say(f"  {row.status:<8} {row.name} {row.detail}".rstrip())
    elif tests:
        rows.append(Row("gpu-tests", "tests", "skipped", "no GPU: --device cpu"))
    spec = {"device": chosen, "recipe": recipe, **{k: v for k, v in policy.items() if v is not None}}
    for name in names:
        say(f"  {name}: {CHECKS[name]} ...")
        row = run_check(name, spec, work)
        rows.append(row)
        say(f"  {row.status:<8} {name} ({row.seconds} s) {row.detail}".rstrip())
    if not keep and not any(r.status == "failed" for r in rows):
        shutil.rmtree(work, ignore_errors=True)
    elif not keep:
        say(f"  the failed checks' folders and logs stay in {work}")
    return rows


def one(name: str, spec_path: str, out_path: str) -> int:
    import logging
    import traceback

    from embodied_r.checks.gpu_policy import check_policy
    from embodied_r.checks.gpu_tiny import CHECKS as TINY
    from embodied_r.checks.steps import Skip
    from embodied_r.io import write_json_atomic

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(spec_path).read_text())
    started = time.monotonic()
    try:
        result = {**TINY, "policy": check_policy}[name](spec)
    except Skip as why:
        result = {"ok": True, "skipped": str(why)}
    except Exception as exc:  # noqa: BLE001 - every failure is the row's finding
        traceback.print_exc()
        result = {"ok": False, "detail": f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}"}
    result["seconds"] = round(time.monotonic() - started, 1)
    write_json_atomic(Path(out_path), result)
    return 0


def memory_table(recipes: list[str], prompt_tokens: int | None = None, gpus: int | None = None,
                 gpu_gib: float | None = None) -> str:
    """Each recipe's estimated memory per GPU where its policy's shape is known here, and
    whether it fits ``gpu_gib`` (else the card the recipe names)."""
    from embodied_r.config import load_recipe
    from embodied_r.training.memory import PARTS, card_needed, estimate, processes, verdict
    from embodied_r.training.shapes import shape_of

    header = ("recipe", "processes", *PARTS, "peak (GiB)")
    cells = [header]
    verdicts = []
    for name in recipes:
        training = load_recipe(name).training
        shape = shape_of(training.policy)
        if shape is None:
            continue
        est = estimate(training, shape, prompt_tokens, gpus=gpus)
        g = est.gib()
        peak = f"{g['peak']:.1f}" + (f" + {est.card_share:.0%} of the card (vLLM)" if est.card_share else "")
        cells.append((name, str(processes(training, gpus)), *(f"{g.get(p, 0.0):.1f}" for p in PARTS), peak))
        card = gpu_gib or training.gpu_gib
        if card is None:
            verdicts.append(f"{name}: names no card (training.gpu_gib); smallest that fits: "
                            f"{card_needed(est) or 'none listed'}")
            continue
        fits, why = verdict(est, card)
        needed = "" if fits else f"; needs a {card_needed(est) or 'larger than any listed'} card"
        verdicts.append(f"{name}: {why}{needed}")
    table = "\n".join("| " + " | ".join(row) + " |" + ("\n|" + "---|" * len(header) if i == 0 else "")
                      for i, row in enumerate(cells))
    return table + ("\n\n" + "\n".join(verdicts) if verdicts else "")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("check", help="check this machine: the GPU path (gpu), each recipe's GPU memory (memory)")
    sub = p.add_subparsers(dest="check_command", required=True)
    gpu = sub.add_parser("gpu", help="the GPU-marked tests, then each GPU check in its own process, as a table",
                         description=__doc__.split("\n\n")[0])
    gpu.add_argument("--device", choices=["auto", "cpu"], default="auto",
                     help="auto: the GPU, or every row skipped without one; cpu: check the checks on the CPU")
    gpu.add_argument("--recipe", default="paper", help="whose policy and settings the policy step runs (default paper)")
    gpu.add_argument("--only", nargs="+", choices=list(CHECKS), help="run only these checks")
    gpu.add_argument("--no-tests", dest="tests", action="store_false", help="leave out the GPU-marked tests")
    gpu.add_argument("--work", type=Path, help="keep every check's folder and log here")
    gpu.add_argument("--steps", type=int, default=2, help="policy step: optimizer steps (the first warms up)")
    gpu.add_argument("--prompt-tokens", type=int, help="policy step: prompt length (default about 950 tokens)")
    gpu.add_argument("--completion-tokens", type=int,
                     help="policy step: cut completions here (default the recipe's max_completion_length)")
    gpu.add_argument("--policy-shape", choices=["tiny"], help=argparse.SUPPRESS)  # the checks' own test
    gpu.add_argument("--measure", action="store_true",
                     help="time the recipe's policy shape (decode, update, optimizer step, peak memory) and project "
                          "the paper schedule's GPU-hours from it (checks/measure.py), instead of the checks")
    gpu.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64], help="measure: decode batch sizes")
    gpu.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048],
                     help="measure: completion lengths of the timed update")
    gpu.add_argument("--decode-tokens", type=int, default=64, help="measure: tokens decoded per timing")
    gpu.add_argument("--micro-batch", type=int, help="measure: sequences a timed update (default per-device batch)")
    gpu.add_argument("--train-prompts", type=int,
                     help="measure: training prompts of the projected schedule (your records' train split)")
    gpu.add_argument("--val-prompts", type=int, default=200, help="measure: validation prompts every 100 steps")
    gpu.add_argument("--projection-gpus", type=int, default=1, help="measure: GPUs sharing each step")
    gpu.add_argument("--out", type=Path, help="measure: the JSON (default under $EMBODIED_R_HOME/checks)")
    gpu.set_defaults(handler=cmd_gpu)
    mem = sub.add_parser("memory", help="each recipe's estimated GPU memory per GPU, part by part, and whether "
                                        "it fits its card")
    mem.add_argument("--recipe", nargs="+", help="recipes (default every shipped one whose policy's shape is known)")
    mem.add_argument("--prompt-tokens", type=int, help="prompt length (default each recipe's max_prompt_length)")
    mem.add_argument("--gpus", type=int, help="GPUs of a launch without an accelerate config (DDP; default 1)")
    mem.add_argument("--gpu-gib", type=float,
                     help="judge the fit on a card of this many GiB (default the card each recipe names)")
    mem.set_defaults(handler=cmd_memory)


def cmd_gpu(args: argparse.Namespace) -> int:
    from embodied_r.backends.devices import device_name

    if args.measure:
        from embodied_r.checks.measure import cmd

        return cmd(args)

    import torch

    print(f"gpu-check: {device_name() if args.device != 'cpu' else 'cpu (forced)'}, torch {torch.__version__}, "
          f"python {sys.executable}")
    rows = run(args.device, args.recipe, args.only, args.tests, args.work, steps=args.steps,
               prompt_tokens=args.prompt_tokens, completion_tokens=args.completion_tokens,
               policy_shape=args.policy_shape)
    print("\n" + table(rows) + "\n")
    print(closing(rows))
    return 1 if any(r.status == "failed" for r in rows) else 0


def cmd_memory(args: argparse.Namespace) -> int:
    from embodied_r.config import available_recipes

    print(memory_table(args.recipe or available_recipes(), args.prompt_tokens, args.gpus, args.gpu_gib))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--one":
        sys.exit(one(*sys.argv[2:5]))
    print("usage: python -m embodied_r.checks.gpu --one NAME SPEC.json OUT.json (embodied-r check gpu runs it)",
          file=sys.stderr)
    sys.exit(2)
