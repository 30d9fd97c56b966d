"""A flow run whose process is killed is found dead by its stopped heartbeats and marked
Crashed; a live one is waited on to its end. Real flow runs in processes of their own,
sending Prefect's own heartbeats to a real local Prefect server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from flows.waiting import DEAD_AFTER_ENV, DEAD_AFTER_S, dead_after_s, is_dead, last_heartbeat, wait_for_runs

ROOT = Path(__file__).resolve().parents[2]
FLOW = """
import sys, time
from prefect import flow
from prefect.context import get_run_context

@flow(name="waited-on")
def waited_on(seconds: float) -> None:
    print(get_run_context().flow_run.id, flush=True)
    time.sleep(seconds)

waited_on(float(sys.argv[1]))
"""


def test_only_a_running_run_whose_beats_stopped_is_dead() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=timezone.utc)
    assert is_dead(True, now - timedelta(seconds=151), now, 150)
    assert not is_dead(True, now - timedelta(seconds=149), now, 150)
    assert not is_dead(True, None, now, 150)  # never sent one: a worker without heartbeats
    assert not is_dead(False, now - timedelta(hours=1), now, 150)  # scheduled, pending: waits for a worker


def test_the_dead_run_limit_is_read_once_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEAD_AFTER_ENV, raising=False)
    assert dead_after_s() == DEAD_AFTER_S
    monkeypatch.setenv(DEAD_AFTER_ENV, "45")
    assert dead_after_s() == 45.0
    for bad in ("0", "soon"):
        monkeypatch.setenv(DEAD_AFTER_ENV, bad)
        with pytest.raises(ValueError, match=DEAD_AFTER_ENV) as info:
            dead_after_s()
        assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def api() -> Any:
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


def _start(api: str, seconds: float) -> tuple[subprocess.Popen, Any]:
    """A flow run in a process of its own, sending heartbeats; returns it once it is running."""
    from prefect.client.orchestration import get_client

    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", FLOW, str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    run_id = proc.stdout.readline().strip()
    assert run_id, "the flow run did not start"
    with get_client(sync_client=True) as client:
        return proc, client.read_flow_run(run_id)


def _wait(runs: dict[str, Any], dead_after: float, limit: float = 120) -> dict[str, Any]:
    """``wait_for_runs`` in a thread of its own, so that a run never found dead fails the test."""
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(wait_for_runs(runs, 0.5, dead_after)), daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), f"still waiting after {limit} s"
    return out


@pytest.mark.slow
def test_a_killed_run_is_marked_crashed_and_a_live_one_is_waited_on(api: str) -> None:
    from prefect.client.orchestration import get_client

    killed, dead = _start(api, 600)
    live, alive = _start(api, 8)
    try:
        deadline = time.monotonic() + 60
        with get_client(sync_client=True) as client:
            while last_heartbeat(client, dead.id) is None:  # the first beat goes out as the run starts
                assert time.monotonic() < deadline, "no heartbeat reached the server"
                time.sleep(0.5)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
        ended = _wait({"dead": dead}, dead_after=2.0)
        state = ended["dead"].state
        assert state.is_crashed() and "no heartbeat for over 2 s" in state.message, state
        # A live run's last beat is its first one, older than the limit would be here: judged
        # by a limit above its heartbeat interval, as dead_after_s requires, it ends completed.
        ended = _wait({"live": alive}, dead_after=60.0)
        assert ended["live"].state.is_completed(), ended["live"].state
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
