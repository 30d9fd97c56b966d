"""Operational settings, signals and bad input, for ``benchmarks/faults.py``.

Each case is ``fn(tmp) -> (outcome, verdict)`` against real servers on 127.0.0.1 and real
``embodied-r`` processes. The signal and full-disk cases share one home whose catalog is built
once (``_Home``); each of them starts perception afresh in it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.fault_kills import OK_ERROR, RECOVERED, case

ROOT = Path(__file__).resolve().parents[1]


def cli(args: list[str], home: Path, timeout: float = 300, **env: Any) -> subprocess.CompletedProcess:
    """``embodied-r ARGS`` in a process of its own, on ``home``."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_R_HOME": str(home),
            "PREFECT_HOME": str(home / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **env}
    return subprocess.run([sys.executable, "-m", "embodied_r.apps.cli", *args], capture_output=True, text=True,
                          env=full, timeout=timeout)


def _one_line(res: subprocess.CompletedProcess, *needles: str) -> tuple[str, bool]:
    err = res.stderr.strip()
    ok = res.returncode != 0 and "\n" not in err and "Traceback" not in err and all(n in err for n in needles)
    return err[:110] + ("..." if len(err) > 110 else ""), ok


# -- operational settings ------------------------------------------------------------------

@case("settings: max_failed_fraction raised, another server, timeout, concurrency")
def _operational(tmp: Path) -> tuple[str, str]:
    from tests.test_operational_settings import _first_run_fails, _perception, _refusing_video_b
    from tests.perception.test_perception import make_inputs
    from tests.perception.test_perception_http import RecordingServer

    from embodied_r.pipeline import execute

    catalog, kf = make_inputs(tmp, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    inputs = {"catalog": str(catalog), "keyframes": str(kf)}
    first, second = RecordingServer(fault=_refusing_video_b), RecordingServer()
    try:
        sp = _first_run_fails(tmp / "home", first, inputs)
        raised = _perception(tmp / "home", second.base_url, inputs, max_failed_fraction=0.5,
                             backend={"timeout_s": 9.0, "concurrency": 1, "max_retries": 2})
        summary = execute(raised)
    finally:
        first.stop()
        second.stop()
    same = raised.out == sp.out
    ok = same and len(second.bodies) == 2 and summary["done"] == 3
    return (f"same folder: {same}; first run 8 calls, 1 question refused; rerun sent {len(second.bodies)} "
            f"calls (the missing 2), done {summary['done']}/3"), RECOVERED if ok else "FAIL"


# -- signals and a full disk, on a home whose catalog is built -----------------------------

class _Home:
    path: Path | None = None

    @classmethod
    def ready(cls, tmp: Path) -> Path:
        """The shared home, key frames done; perception cleared for the next case."""
        from tests.flows.test_interrupts import _fresh_perception, _recipe, _run

        if cls.path is None:
            home = tmp / "home"
            for stage in ("download", "preprocess", "keyframes"):
                done = _run(home, stage, "--recipe", str(_recipe(tmp, "http://127.0.0.1:9/v1")))
                if done.returncode:
                    raise RuntimeError(f"{stage}: {done.stderr[-300:]}")
            cls.path = home
        _fresh_perception(cls.path)
        return cls.path


def _signal_case(tmp: Path, signum: int, group: bool, act: Any = None) -> tuple[str, str]:
    """Perception under way, then ``signum`` (or ``act(pid)``): one line, every process ended,
    and the rerun sends only the missing calls."""
    from tests.flows.test_interrupts import Slow, _interrupt, _logged, _recipe, _run, running

    home = _Home.ready(tmp)
    slow = Slow(delay_s=1.0)
    try:
        rc, took, text, children = _interrupt(home, ["perception", "--recipe", str(_recipe(tmp, slow.base_url))],
                                              signum, lambda: _logged(home) >= 4, group=group, act=act)
    finally:
        slow.stop()
    last = text.strip().splitlines()[-1] if text.strip() else ""
    time.sleep(1.0)
    left = [pid for pid, start in children.items() if running(pid, start)]
    logged = _logged(home)
    fast = Slow(delay_s=0.0)
    try:
        again = _run(home, "perception", "--recipe", str(_recipe(tmp, fast.base_url)))
    finally:
        fast.stop()
    total = int(re.search(r" of (\d+) calls", last).group(1)) if " of " in last else -1
    expected, bound, opening = (1, 35, "stopped during") if act else (128 + signum, 10, "interrupted during")
    if act and again.returncode == 0:  # the Prefect line names no count: the stage's summary does
        import json

        total = json.loads(next((home / "stages" / "perception").glob("*/summary.json")).read_text())["calls"]
    clean = (rc == expected and took < bound and "Traceback" not in text and last.startswith(opening)
             and not left and again.returncode == 0 and len(fast.bodies) == total - logged)
    return (f"exit {rc} in {took:.1f} s: \"{last}\"; {len(children)} processes ended; rerun sent "
            f"{len(fast.bodies)} calls (of {total})"), OK_ERROR if clean else "FAIL"


@case("Ctrl-C (SIGINT to the group) during perception")
def _sigint(tmp: Path) -> tuple[str, str]:
    return _signal_case(tmp, signal.SIGINT, group=True)


@case("SIGTERM to the CLI during perception")
def _sigterm(tmp: Path) -> tuple[str, str]:
    return _signal_case(tmp, signal.SIGTERM, group=False)


@case("Prefect's ephemeral server killed (kill -9) during perception")
def _prefect_killed(tmp: Path) -> tuple[str, str]:
    from tests.flows.test_interrupts import _kill_prefect_server

    return _signal_case(tmp, 0, group=False, act=_kill_prefect_server)


@case("Ctrl-C during key frames (stalled at video 2)")
def _sigint_keyframes(tmp: Path) -> tuple[str, str]:
    from tests.flows.test_interrupts import _interrupt, _recipe, _run, running

    from embodied_r.io import STALL_ENV, STALL_MARKER_ENV

    home = tmp / "home"
    recipe = str(_recipe(tmp, "http://127.0.0.1:9/v1"))
    for stage in ("download", "preprocess"):
        _run(home, stage, "--recipe", recipe)
    marker = tmp / "stalled"
    rc, took, text, children = _interrupt(home, ["keyframes", "--recipe", recipe], signal.SIGINT, marker.exists,
                                          group=True, **{STALL_ENV: "keyframes:2", STALL_MARKER_ENV: str(marker)})
    last = text.strip().splitlines()[-1]
    time.sleep(1.0)
    left = [pid for pid, start in children.items() if running(pid, start)]
    again = _run(home, "keyframes", "--recipe", recipe)
    clean = rc == 130 and took < 10 and "Traceback" not in text and not left and again.returncode == 0
    return (f"exit {rc} in {took:.1f} s: \"{last}\"; {len(children)} processes ended (workers, Prefect's "
            f"server); rerun finished"), OK_ERROR if clean else "FAIL"


@case("disk full mid-perception (at the item log's write)")
def _disk_full(tmp: Path) -> tuple[str, str]:
    from tests.flows.test_interrupts import FULL_DISK, Slow, _env, _logged, _recipe

    home = _Home.ready(tmp)
    srv = Slow(delay_s=0.0)
    try:
        done = subprocess.run([sys.executable, "-c", FULL_DISK.replace("{n}", "5"), "perception", "--recipe",
                               str(_recipe(tmp, srv.base_url))], env=_env(home), cwd=ROOT, capture_output=True,
                              text=True, timeout=600)
    finally:
        srv.stop()
    text = (done.stdout + done.stderr).strip()
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    ok = done.returncode == 1 and len(errors) == 1 and "Traceback" not in text and _logged(home) == 5
    return (f"{len(text.splitlines())} lines, {len(errors)} error: {errors[0][:90] if errors else ''}...; "
            f"{_logged(home)} logged calls kept"), OK_ERROR if ok else "FAIL"


# -- bad input, named early ----------------------------------------------------------------

@case("empty recipe file")
def _empty(tmp: Path) -> tuple[str, str]:
    (tmp / "mine.yaml").write_text("# to do\n")
    outcome, ok = _one_line(cli(["validate", "--recipe", str(tmp / "mine.yaml")], tmp / "home"), "is empty")
    return outcome, OK_ERROR if ok else "FAIL"


@case("openai backend without base_url or key (validate, run)")
def _no_server(tmp: Path) -> tuple[str, str]:
    sets = ["--set", "perception.backend.kind=openai", "--set", "perception.backend.model=vlm",
            "--set", "perception.backend.api_key_env=EMBODIED_R_NO_SUCH_KEY"]
    outcome, ok = _one_line(cli(["validate", "--recipe", "smoke", *sets], tmp / "home"), "perception.backend")
    started = time.monotonic()
    _, run_ok = _one_line(cli(["run", "--recipe", "smoke", *sets], tmp / "home"), "perception.backend")
    took = time.monotonic() - started
    ok = ok and run_ok and not (tmp / "home" / "stages").exists()
    return f"{outcome} (run refused in {took:.1f} s, no stage started)", OK_ERROR if ok else "FAIL"


@case("--no-wait on a busy stage: the advice names real flags")
def _no_wait(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_late_errors import test_the_busy_stage_message_names_only_flags_that_exist as check

    import pytest

    with pytest.MonkeyPatch.context() as mp:
        check(tmp, mp)
    return "every flag the message names exists (--no-wait)", OK_ERROR


@case("disk check on a tiny model")
def _disk_units(tmp: Path) -> tuple[str, str]:
    from embodied_r.backends.models import resolve_model
    from embodied_r.errors import DiskSpaceError
    from embodied_r.training import disk
    from embodied_r.training.environment import TrainerEnvironment

    before = os.environ.get("EMBODIED_R_HOME")
    os.environ["EMBODIED_R_HOME"] = str(tmp / "home")
    try:
        model = resolve_model("tiny:lm")
    finally:
        os.environ.pop("EMBODIED_R_HOME") if before is None else os.environ.update(EMBODIED_R_HOME=before)
    free = disk.free_bytes
    disk.free_bytes = lambda path: 20_000  # a disk with 20 kB left
    try:
        disk.check_disk(tmp / "out", model, TrainerEnvironment(), steps=10, what="train_stage1")
        return "passed", "FAIL"
    except DiskSpaceError as exc:
        text = str(exc)
    finally:
        disk.free_bytes = free
    ok = "0.0 GB" not in text and re.search(r"\d (MB|kB) of disk", text) is not None
    return text.split(":")[0][:100], OK_ERROR if ok else "FAIL"


@case("eval-model with a folder that does not exist")
def _missing_model(tmp: Path) -> tuple[str, str]:
    res = cli(["eval-model", str(tmp / "runs" / "model"), "--recipe", "smoke", "--no-track"], tmp / "home")
    outcome, ok = _one_line(res, "does not exist")
    return outcome, OK_ERROR if ok and "Repo id" not in res.stderr else "FAIL"


@case("answer letter not among the options")
def _not_an_option(tmp: Path) -> tuple[str, str]:
    from tests.data.test_download_catalog import _mirror

    mirror = _mirror(tmp / "mirror")
    for stage in ("download", "preprocess"):
        res = cli([stage, "--recipe", "smoke", "--source", str(mirror)], tmp / "home")
    line = next((t for t in res.stdout.splitlines() if t.startswith("[stage] preprocess") and " done " in t), "")
    ok = res.returncode == 0 and "left out" in line and "failures.parquet" in line
    return line.split("done", 1)[-1].strip()[:120], OK_ERROR if ok else "FAIL"


@case("promote: true with an empty val split (validate, after the catalog)")
def _empty_val(tmp: Path) -> tuple[str, str]:
    from tests.data.test_download_catalog import _mirror

    static, ok = _one_line(cli(["validate", "--recipe", "smoke", "--set", "catalog.split.val=0", "--set",
                                "catalog.split.train=0.75"], tmp / "a"), "tracking.promote")
    mirror = _mirror(tmp / "mirror")
    res = cli(["run", "--recipe", "smoke", "--source", str(mirror), "--set",
               "catalog.split={train: 0.79, val: 0.01, test: 0.2, seed: 0, folds: 2}"], tmp / "b")
    last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    early = res.returncode == 2 and "no val questions" in last and not (tmp / "b" / "stages" / "keyframes").exists()
    return f"validate: {static[:60]}...; run: stopped after the catalog", OK_ERROR if ok and early else "FAIL"
