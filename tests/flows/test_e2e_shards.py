"""End to end: perception in two shards through the stage's deployment, on a real local
Prefect server with a process pool of two workers and two local OpenAI-compatible servers.
The merged folder equals an unsharded run's; then one shard's worker is SIGKILLed mid-run,
and the rerun does that shard alone, resuming from its log, and loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

# Prefect reads its settings from the environment once, at import (see test_e2e_deployments).
import prefect.context  # noqa: F401
import pytest

from embodied_r.backends.base import BackendConfig
from embodied_r.config import load_recipe
from embodied_r.io import STALL_ENV, STALL_MARKER_ENV, is_complete, partial_path, read_summary
from embodied_r.perception.stage import _read_inputs, _split, run_perception
from embodied_r.perception.config import PerceptionConfig
from embodied_r.pipeline import execute, plan
from embodied_r.shards import shard_folder, shard_of
from tests.perception.test_perception_http import RecordingServer
from tests.flows.test_shards import PERCEPTION_TABLES, same_folders
from tests.servers import background, run_ok, serve_on_free_port

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Several servers behind one backend, each shard pinned to its own, where the backend has them.
PINNED = "base_urls" in BackendConfig.model_fields


def _parent(env: dict[str, str], home: Path, overrides: dict[str, Any], log: Path) -> subprocess.Popen:
    """The dispatching flow's part, in a process of its own: the shards, then the merge."""
    code = ("import json, sys; from pathlib import Path; from flows.shards import dispatch_stage; "
            "dispatch_stage('smoke', 'perception', Path(sys.argv[1]), json.loads(sys.argv[2]))")
    import json

    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-c", code, str(home), json.dumps(overrides)], cwd=REPO,
                                env={**env, "PYTHONPATH": str(REPO)}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _worker_of(pid: int, workers: list[subprocess.Popen]) -> subprocess.Popen:
    """The worker whose process tree holds ``pid`` (a flow run it started)."""
    while pid > 1:
        for w in workers:
            if w.pid == pid:
                return w
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("the stalled shard's process belongs to no worker")


def test_perception_shards_on_two_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "EMBODIED_R_HOME": str(home), "EMBODIED_R_CHECKOUT": str(REPO),
           "EMBODIED_R_RECIPE": "smoke",
           "PATH": f"{BIN}:{os.environ['PATH']}", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    for key in ("PREFECT_API_KEY", "PREFECT_API_URL"):
        env.pop(key, None)
    servers = [RecordingServer(), RecordingServer()]
    where = ({"base_urls": [s.base_url for s in servers]} if PINNED else {"base_url": servers[0].base_url})
    overrides = {"perception": {"shards": 2, "backend": {
        "kind": "openai", "model": "vlm", "api_key_env": "EMBODIED_R_TEST_NO_KEY", "max_retries": 0,
        "timeout_s": 30.0, "concurrency": 4, **where}}}

    # The inputs and the unsharded reference are made here while the Prefect server starts.
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    stages = plan(load_recipe("smoke", overrides), home)
    sp = stages["perception"]
    out, catalog, keyframes = Path(sp.out), Path(sp.inputs["catalog"]), Path(sp.inputs["keyframes"])
    cfg = PerceptionConfig.model_validate(sp.config)

    failed: list[BaseException] = []

    def prepare() -> None:
        try:
            for name in ("download", "preprocess", "keyframes"):
                execute(stages[name])
            run_perception(catalog, keyframes, tmp_path / "ref", cfg.model_copy(update={"shards": 1}))
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            failed.append(exc)

    prepared = threading.Thread(target=prepare)
    prepared.start()

    def sent() -> int:
        return sum(len(s.bodies) for s in servers)

    with ExitStack() as stack:
        stack.callback(lambda: [s.stop() for s in servers])
        stack.callback(prepared.join)
        _, port = stack.enter_context(serve_on_free_port(
            lambda p: [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(p)],
            tmp_path / "prefect-server.log", env, ready_path="/api/health", timeout=180))
        env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
        # The stage's pool with no limit of its own: it runs as many flows as it has workers,
        # each worker one at a time (one GPU each).
        run_ok([str(BIN / "prefect"), "--no-prompt", "work-pool", "create", "gpu-infer", "--type", "process"], env)

        def start_workers(n: int, extra: dict[str, str], tag: str) -> list[subprocess.Popen]:
            return [stack.enter_context(background(
                ["bash", str(REPO / "infra" / "start-worker.sh"), "gpu-infer", "--limit", "1"],
                tmp_path / f"worker-{tag}{i}.log", {**env, **extra})) for i in range(n)]

        def finish(proc: subprocess.Popen, timeout: float = 240) -> None:
            assert proc.wait(timeout) == 0, (tmp_path / "parent.log").read_text()[-4000:]

        # 1. Two shards at once on two workers, merged: the unsharded run's folder.
        first = start_workers(2, {}, "a")
        run_ok([str(BIN / "prefect"), "--no-prompt", "deploy", "--name", "perception"], env)
        prepared.join()
        if failed:
            raise failed[0]
        ready, _ = _split(*_read_inputs(catalog, keyframes))
        needed = [sum(len(q.frames) for q in ready if shard_of(q.video_id, 2) == k) for k in range(2)]
        assert min(needed) < max(needed)  # the larger shard alone reaches the stall below
        big = needed.index(max(needed))
        for server in servers:
            server.bodies.clear()
        finish(_parent(env, home, overrides, tmp_path / "parent.log"))
        summary = same_folders(tmp_path / "ref", out, PERCEPTION_TABLES)
        assert sent() == sum(needed) and summary["shards"]["count"] == 2
        assert len({summary["shards"][k]["where"] for k in ("1", "2")}) == 2  # two processes
        if PINNED:  # shard i on server i
            assert [len(s.bodies) for s in servers] == needed
        # The stage's MLflow run, recorded by the merge, has each shard's counts.
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
        (run,) = client.search_runs([client.get_experiment_by_name("embodied-r").experiment_id],
                                    filter_string="tags.stage = 'perception'")
        assert [run.data.metrics[f"summary/shards/{k}/done"] for k in (1, 2)] == needed

        # 2. Again from nothing, with workers whose flow runs stop after one call more than the
        # smaller shard has: only the larger shard gets there. Its worker is SIGKILLed once the
        # other shard is done.
        # The first workers must be gone before the stalling ones start: one still shutting
        # down after a SIGTERM can take a new flow run, which then never stalls.
        for w in first:
            os.killpg(w.pid, signal.SIGKILL)
            w.wait()
        subprocess.run(["rm", "-rf", str(out)], check=True)
        marker, stall = tmp_path / "stalled", min(needed) + 1
        workers = start_workers(2, {STALL_ENV: f"perception:{stall}", STALL_MARKER_ENV: str(marker)}, "b")
        parent = _parent(env, home, overrides, tmp_path / "parent.log")
        other = shard_folder(out, 1 - big, 2)
        deadline = time.time() + 240
        while not (marker.exists() and is_complete(other)):
            assert time.time() < deadline and parent.poll() is None, (tmp_path / "parent.log").read_text()[-4000:]
            time.sleep(0.2)
        stalled = int(marker.read_text().split()[1])
        victim = _worker_of(stalled, workers)
        os.killpg(victim.pid, signal.SIGKILL)
        if Path(f"/proc/{stalled}").exists():  # a flow run the worker started in a session of its own
            os.kill(stalled, signal.SIGKILL)
        os.killpg(parent.pid, signal.SIGKILL)  # the pipeline waiting on it goes down too
        parent.wait()
        killed = shard_folder(out, big, 2)
        assert not is_complete(killed) and partial_path(killed).is_dir()
        logged = len((partial_path(killed) / "items.jsonl").read_text().splitlines())
        assert logged >= stall
        finished_where = read_summary(other)["where"]

        # 3. The rerun sends the killed shard alone; its logged calls are not sent again.
        workers += start_workers(1, {}, "c")
        before = sent()
        finish(_parent(env, home, overrides, tmp_path / "parent.log"))
        assert sent() - before == needed[big] - logged
        merged = same_folders(tmp_path / "ref", out, PERCEPTION_TABLES, frozenset({"calls_made", "calls_failed"}))
        assert merged["shards"][str(2 - big)]["where"] == finished_where  # the finished shard: not redone
        assert not merged["shards"][str(big + 1)]["where"].endswith(f":{stalled}")  # the killed shard: redone
