"""Processes end and start cleanly: a backend never holds up the interpreter's exit, and runs
started together on a fresh home do not break each other while creating the MLflow store.

Real processes: the hang at exit and the store's race exist only between threads frozen by
interpreter shutdown and between processes migrating one SQLite file.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

BUILD = (
    "from embodied_r.backends.base import BackendConfig\n"
    "from embodied_r.backends.openai_compat import OpenAIBackend\n"
    "backend = OpenAIBackend(BackendConfig(kind='openai', model='m', base_url='http://127.0.0.1:9/v1'))\n"
)


@pytest.mark.parametrize("code", [
    # Never closed: the finaliser runs at interpreter exit, when the loop's thread is frozen.
    BUILD + "print('built', flush=True)\n",
    # Closed after its loop stopped (a loop that no longer runs must not be waited for).
    BUILD + "backend._loop.loop.call_soon_threadsafe(backend._loop.loop.stop)\n"
            "backend._loop.thread.join(5)\nbackend.close()\nprint('built', flush=True)\n",
], ids=["never-closed", "loop-stopped"])
def test_a_backend_never_holds_up_the_exit(code: str) -> None:
    started = time.monotonic()
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the process still ran 30 s after its last line: the backend blocks the exit")
    assert res.returncode == 0 and "built" in res.stdout, res.stderr[-2000:]
    assert time.monotonic() - started < 30


OPEN_STORE = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from embodied_r.paths import default_tracking_uri\n"
    "from embodied_r.tracking.runs import Tracker\n"
    "import mlflow.store.tracking.sqlalchemy_store\n"  # the slow imports before the start line
    "home, go = Path(sys.argv[1]), Path(sys.argv[2])\n"
    "while not go.exists():\n"
    "    time.sleep(0.01)\n"
    "print(Tracker.open('race', default_tracking_uri(home), home).experiment_id, flush=True)\n"
)


def test_runs_started_together_on_a_fresh_home_share_one_mlflow_store(tmp_path: Path) -> None:
    for attempt in range(3):  # without the lock, about two tries in five fail
        home, go = tmp_path / f"home{attempt}", tmp_path / f"go{attempt}"
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_STORE, str(home), str(go)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(3)]
        time.sleep(8)  # every process waits at the start line
        go.touch()
        outs = [p.communicate(timeout=180) for p in procs]
        for proc, (out, err) in zip(procs, outs):
            assert proc.returncode == 0, err[-3000:]
        assert len({out.strip() for out, _ in outs}) == 1, outs  # one experiment, not one each
