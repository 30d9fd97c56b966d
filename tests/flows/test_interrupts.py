"""Ctrl-C and SIGTERM to a real ``embodied-r`` process: it stops within seconds with one line
saying where, exit 130 / 143, no traceback, no process of its own left, and the rerun
resumes with only the missing work. A disk that fills mid-stage stops it in one line too.

Real processes and real signals: the CLI runs as a user starts it, its perceiver is a slow
OpenAI-compatible server on 127.0.0.1 so that calls are in flight when the signal lands.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from embodied_r.apps.reaper import descendants
from embodied_r.io import STALL_ENV, STALL_MARKER_ENV
from tests.servers import ChatStub, StubReply, completion
from tests.perception.test_perception_http import reply_for

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 10.0

RECIPE = """
extends: smoke
name: interrupted
download:
  synthetic: {urban_videos: 8, clips_per_scene: 2, vsi_scenes: 1, seconds: 4, width: 320, height: 180}
keyframes: {max_frames: 4, workers: 2}
perception:
  backend: {kind: openai, model: vlm, base_url: "URL", api_key_env: EMBODIED_R_TEST_NO_KEY,
            max_retries: 0, timeout_s: 30, concurrency: 2, max_pixels: 4096}
"""


class Slow(ChatStub):
    """A perceiver that answers each call after ``delay_s``."""

    def __init__(self, delay_s: float):
        super().__init__(lambda body: StubReply(payload=completion(body["model"], reply_for(body)), delay_s=delay_s))


def running(pid: int, start: str) -> bool:
    """Whether that process still runs (a zombie waiting to be reaped does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == start


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMBODIED_R_", "PREFECT_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(ROOT), EMBODIED_R_HOME=str(home), PREFECT_HOME=str(home / "prefect"), **extra)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from embodied_r.apps.cli import main; sys.exit(main())", *args]


def _recipe(tmp: Path, url: str, name: str = "interrupted") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(RECIPE.replace("URL", url))
    return path


def _run(home: Path, *args: str, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(_cli(*args), env=_env(home, **env), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A home whose catalog is built (download and preprocess done)."""
    root = tmp_path_factory.mktemp("interrupts")
    for stage in ("download", "preprocess"):
        done = _run(root / "home", stage, "--recipe", str(_recipe(root, "http://127.0.0.1:9/v1")))
        assert done.returncode == 0, done.stderr[-3000:]
    yield root / "home"


def _interrupt(home: Path, args: list[str], signum: int, ready: Any, group: bool, act: Any = None,
               **env: str) -> tuple[int, float, str, dict[int, str]]:
    """Start the CLI, wait until ``ready()``, send ``signum`` (to the process group, as a
    terminal's Ctrl-C does, or to the process alone, as a service manager does), or call
    ``act(pid)`` instead. Returns the exit status, the seconds from signal to exit, the output
    and the processes it had started."""
    out = home.parent / f"out-{signum}.txt"
    with open(out, "w") as fh:
        proc = subprocess.Popen(_cli(*args), env=_env(home, **env), cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while not ready():
            assert proc.poll() is None, f"ended before the signal ({proc.returncode}):\n{out.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "never got under way:\n" + out.read_text()[-3000:]
            time.sleep(0.1)
        children = descendants(proc.pid)
        sent = time.monotonic()
        if act is not None:
            act(proc.pid)
        else:
            os.killpg(proc.pid, signum) if group else os.kill(proc.pid, signum)
        rc = proc.wait(timeout=90)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return rc, took, out.read_text(), children


def _assert_clean(rc: int, took: float, text: str, children: dict[int, str], signum: int, line: str) -> None:
    assert rc == 128 + signum, text[-3000:]
    assert took < BOUND_S, f"took {took:.1f} s to stop"
    assert "Traceback" not in text and "Error" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith(line) and last.endswith("rerun to resume"), last
    time.sleep(1.0)
    left = [pid for pid, start in children.items() if running(pid, start)]
    assert children and not left, f"still running: {left}"


def test_ctrl_c_during_key_frames_stops_at_once(home: Path, tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, "http://127.0.0.1:9/v1")
    marker = tmp_path / "stalled"
    rc, took, text, children = _interrupt(
        home, ["keyframes", "--recipe", str(recipe)], signal.SIGINT, marker.exists, group=True,
        **{STALL_ENV: "keyframes:2", STALL_MARKER_ENV: str(marker)})
    _assert_clean(rc, took, text, children, signal.SIGINT, "interrupted during keyframes: 2 of ")
    again = _run(home, "keyframes", "--recipe", str(recipe))
    assert again.returncode == 0, again.stderr[-3000:]
    # Its done line says what it kept of the interrupted run: the 2 videos logged before the stall.
    assert "done, 0 failed (2 videos kept from the interrupted run)" in again.stdout, again.stdout[-3000:]


def _logged(home: Path) -> int:
    logs = list((home / "stages" / "perception").glob("*.partial/items.jsonl"))
    return sum(1 for log in logs for _ in open(log)) if logs else 0


@pytest.mark.parametrize("signum, group", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_a_signal_during_perception_stops_at_once_and_the_rerun_resumes(home: Path, tmp_path: Path,
                                                                         signum: int, group: bool) -> None:
    slow = Slow(delay_s=1.0)
    try:
        recipe = _key_frames_done(home, tmp_path, slow.base_url)
        rc, took, text, children = _interrupt(home, ["perception", "--recipe", str(recipe)], signum,
                                              lambda: _logged(home) >= 4, group=group)
    finally:
        slow.stop()
    _assert_clean(rc, took, text, children, signum, "interrupted during perception: ")
    done, total = (int(x) for x in text.strip().splitlines()[-1].split(": ")[1].split(" calls")[0].split(" of "))
    logged = _logged(home)
    assert done <= logged and 4 <= done < total

    fast = Slow(delay_s=0.0)
    try:
        resumed = _run(home, "perception", "--recipe", str(_recipe(tmp_path, fast.base_url)))
    finally:
        fast.stop()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(next((home / "stages" / "perception").glob("*/summary.json")).read_text())
    assert summary["calls"] == total and len(fast.bodies) == total - logged
    assert f"({logged} calls kept from the interrupted run)" in resumed.stdout, resumed.stdout[-3000:]


def _key_frames_done(home: Path, tmp: Path, url: str) -> Path:
    """A recipe whose perceiver is at ``url``, its key frames done and perception cleared."""
    _fresh_perception(home)
    recipe = _recipe(tmp, url)
    made = _run(home, "keyframes", "--recipe", str(recipe))
    assert made.returncode == 0, made.stderr[-3000:]
    return recipe


def _fresh_perception(home: Path) -> None:
    """Each test starts the perception stage afresh (the key frames stay)."""
    import shutil

    for folder in (home / "stages" / "perception").glob("*"):
        shutil.rmtree(folder) if folder.is_dir() else folder.unlink()


# The item log's write fails as on a full disk once this many calls are logged.
FULL_DISK = """
import errno, sys
from embodied_r import io
calls = [0]
repair = io.ItemLog._repair_tail
def full(self):
    calls[0] += 1
    if calls[0] > {n}:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
    repair(self)
io.ItemLog._repair_tail = full
from embodied_r.apps.cli import main
sys.exit(main())
"""


def test_a_full_disk_during_perception_stops_it_in_one_line(home: Path, tmp_path: Path) -> None:
    srv = Slow(delay_s=0.0)
    try:
        recipe = _key_frames_done(home, tmp_path, srv.base_url)
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", FULL_DISK.replace("{n}", "5"), "perception", "--recipe",
                               str(recipe)], env=_env(home), cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        srv.stop()
    text = done.stdout + done.stderr
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, text[-3000:]
    # The item log keeps the disk's error on its chain, so the stage says it as every full disk is said.
    (partial,) = (home / "stages" / "perception").glob("*.partial")
    assert errors[0].startswith(f"error: perception: the disk under {partial} is full"), errors[0]
    assert f"kept in {partial.name} and the rerun resumes it" in errors[0], errors[0]
    assert "Traceback" not in text and len(text.strip().splitlines()) <= 4, text[-3000:]
    assert time.monotonic() - started < 120  # no retries of a stage that cannot write
    assert _logged(home) == 5  # every call logged before the disk filled is kept


def _prefect_server(pid: int) -> int | None:
    """The ephemeral Prefect API server among the processes ``pid`` started."""
    for child in descendants(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "uvicorn" in cmd and "prefect" in cmd:
            return child
    return None


def _kill_prefect_server(pid: int) -> None:
    server = _prefect_server(pid)
    assert server is not None, "no ephemeral Prefect server among the run's processes"
    os.kill(server, signal.SIGKILL)


def test_a_prefect_server_killed_under_a_run_is_named_in_one_line(home: Path, tmp_path: Path) -> None:
    slow = Slow(delay_s=1.0)
    try:
        recipe = _key_frames_done(home, tmp_path, slow.base_url)
        rc, took, text, children = _interrupt(home, ["perception", "--recipe", str(recipe)], 0,
                                              lambda: _logged(home) >= 4, group=False, act=_kill_prefect_server)
    finally:
        slow.stop()
    assert rc == 1, text[-3000:]
    assert took < 35, f"named only after {took:.0f} s"
    last = text.strip().splitlines()[-1]
    assert last.startswith("stopped during perception: Prefect's API server") and "exited" in last, last
    assert last.endswith("rerun to resume") and "Traceback" not in text, text[-3000:]
    time.sleep(1.0)
    assert not [pid for pid, start in children.items() if running(pid, start)]
