"""A cancel from Prefect stops a deployed pipeline and the stage run it sent, even after the
Prefect server was killed and started again under them, when the worker no longer watches its
flow runs ("Cancellation observer failed"): real server, worker, deployments and processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

# Prefect reads its settings once, at import: before this test points the environment elsewhere.
import prefect.context  # noqa: F401
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from embodied_r.io import STALL_ENV, STALL_MARKER_ENV
from tests.servers import background, free_port, run_ok, wait_http

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GAVE_UP = "Cancellation observer failed"
# Where the worker's one observer of all its runs gives up instead, Prefect's callback for it
# fails before the line above is logged; its traceback names the observer's polling task.
RUNNER_GAVE_UP = "FlowRunCancellingObserver._handle_polling_task_done"


def _server(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(["bash", str(REPO / "infra" / "start-prefect.sh")], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def _until(check, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(every)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(1500)
def test_a_cancel_after_a_server_restart_stops_the_pipeline_and_its_stage_run(tmp_path, monkeypatch):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    marker = tmp_path / "stalled"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "2", "EMBODIED_R_HOME": str(tmp_path / "home"),
           "PATH": f"{BIN}:{os.environ['PATH']}", "PREFECT_PORT": str(port), "PREFECT_API_URL": api,
           "PYTHONPATH": str(REPO),
           # The stage run sent first (download) waits after its first item, as a long stage would.
           STALL_ENV: "download:1", STALL_MARKER_ENV: str(marker)}
    for key in ("PREFECT_API_KEY", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)
    for key in ("PREFECT_HOME", "PREFECT_API_URL"):
        monkeypatch.setenv(key, env[key])
    server_log, worker_log = tmp_path / "prefect-server.log", tmp_path / "worker-cpu.log"

    with ExitStack() as stack:
        server = _server(env, server_log)
        stack.callback(lambda: os.killpg(server.pid, signal.SIGKILL) if server.poll() is None else None)
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api}))
        run_ok(["bash", str(REPO / "infra" / "deploy.sh"), "--recipe", "smoke"], env, timeout=600)
        worker = stack.enter_context(background(["bash", str(REPO / "infra" / "start-worker.sh"), "cpu"],
                                                worker_log, env, as_from_a_script=True))
        started = run_ok([str(BIN / "prefect"), "deployment", "run", "embodied-r/full-pipeline",
                        "--param", "recipe=smoke"], env)
        pipeline = re.search(r"UUID:\s*([0-9a-f-]{36})", started).group(1)
        _until(marker.exists, 600, "the download stage run stalled")
        stalled = int(marker.read_text().split()[1])

        # The server killed with its whole group; back once the worker has given up watching both
        # flow runs (the pipeline's and the stage's) for cancels.
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        # Prefect gives up after its websocket's reconnects and three polls, each with the client's
        # own retries: about 4 minutes on an idle machine, more on a loaded one.
        def gave_up() -> bool:
            said = worker_log.read_text(errors="replace")
            return said.count(GAVE_UP) >= 2 or RUNNER_GAVE_UP in said

        _until(gave_up, 720, f"the worker's {GAVE_UP!r} for both flow runs, or its observer's end", every=2)
        server = _server(env, server_log)
        wait_http(f"{api}/health", 180, server, server_log)

        run_ok([str(BIN / "prefect"), "flow-run", "cancel", pipeline], env)

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

        def ended() -> list | None:
            with get_client(sync_client=True) as client:
                run = client.read_flow_run(pipeline)
                sent = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
            states = [run.state.type.value] + [r.state.type.value for r in sent]
            return sent if all(s == "CANCELLED" for s in states) and not _alive(stalled) else None

        sent = _until(ended, 120, "the pipeline and its stage run cancelled, the stage's process gone", every=2)
        assert [r.name for r in sent] and all(r.flow_id == sent[0].flow_id for r in sent), sent
        said = worker_log.read_text(errors="replace")
        # Each process said in one line where the cancel stopped it.
        assert "cancelled during download" in said and "cancelled, with the stage runs it sent (" in said, said[-3000:]
        assert worker.poll() is None, "the worker went down with the runs"
