"""The watch on Prefect's API (embodied_r.apps.prefect_watch) against a real ephemeral server,
frozen with SIGSTOP: frozen before its first answer it is a slow start, which Prefect waits out
(the CLI gives it 300 s), and nothing is said; frozen after it answered it is named as silent.

The watch's two waits are shortened (WAIT_S 2 s, POLL_S 1 s) so that each phase takes seconds;
the scenario runs in a process of its own, where the only ephemeral server is this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

SCENARIO = r"""
import json, os, signal, threading, time
from prefect.server.api.server import SubprocessASGIServer
from embodied_r.apps import prefect_watch as watch

watch.WAIT_S, watch.POLL_S = 2.0, 1.0


def watch_for(seconds):
    said, since, t0 = [], None, time.monotonic()
    while time.monotonic() - t0 < seconds:
        why, since = watch.problem(since)
        if why:
            said.append(why)
            break
        time.sleep(0.3)
    return said


server = SubprocessASGIServer()
start = threading.Thread(target=server.start, kwargs={"timeout": 240}, daemon=True)
start.start()
while server.server_process is None:
    time.sleep(0.001)
pid = server.server_process.pid
os.kill(pid, signal.SIGSTOP)  # before the interpreter has even imported uvicorn: no answer yet
try:
    starting = watch_for(4 * watch.WAIT_S)
    os.kill(pid, signal.SIGCONT)
    start.join(240)
    answered = watch.problem(None)[0]
    os.kill(pid, signal.SIGSTOP)
    silent = watch_for(30)
finally:
    os.kill(pid, signal.SIGCONT)
    server.stop()
print(json.dumps({"starting": starting, "answered": answered, "silent": silent, "url": server.api_url}))
"""


def test_a_slow_start_is_waited_out_and_a_silent_server_is_named(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    done = subprocess.run([sys.executable, "-c", SCENARIO], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["starting"] == [], seen  # a start frozen for 8 s (four times the wait) is not a death
    assert seen["answered"] is None, seen
    assert seen["silent"] == [f"Prefect's API at {seen['url']} has not answered for 3 s"], seen
