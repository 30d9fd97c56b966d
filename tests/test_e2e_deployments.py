"""End to end: real Prefect and MLflow servers on 127.0.0.1, work pools, deployments from
prefect.yaml, workers per pool, the full pipeline run by `prefect deployment run`. (Recomputing
one stage with `refresh` is tested under Prefect in tests/test_flow_demo.py, in seconds rather
than the minute a second run through the pools takes.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

# Prefect reads its settings from the environment once, at import: import it before this test
# points the environment at its own servers, or every later test of the session would keep
# calling those servers once they are gone.
import prefect.context  # noqa: F401
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.servers import background, serve_on_free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STAGES = {"download", "preprocess", "keyframes", "perception", "convert",
          "train_stage1", "train_stage2", "train_stage3", "evaluate"}
KINDS = ["download", "preprocess", "keyframes", "perception", "convert", "train", "evaluate"]


def _run(cmd: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _deployment_run(env: dict[str, str], name: str, *params: str) -> str:
    args = [str(BIN / "prefect"), "deployment", "run", name]
    for p in params:
        args += ["--param", p]
    out = _run(args, env)
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", out)
    assert found, out
    return found.group(1)


def _wait_flow_run(flow_run_id: str, workers: list, timeout: float = 900):
    from prefect.client.orchestration import get_client

    deadline = time.time() + timeout
    with get_client(sync_client=True) as client:
        while time.time() < deadline:
            dead = [w.args for w in workers if w.poll() is not None]
            assert not dead, f"worker exited: {dead}"
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final():
                return run
            time.sleep(2)
    raise TimeoutError(f"flow run {flow_run_id} did not finish in {timeout} s")


def _children(uri: str, parent_id: str) -> dict:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_id)
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    return {r.data.tags["stage"]: r for r in runs}


def _parents(uri: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("embodied-r")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    return [r for r in runs if "mlflow.parentRunId" not in r.data.tags]


def test_full_pipeline_by_deployment_on_pools(tmp_path, monkeypatch):
    home = tmp_path / "home"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "2",
           "EMBODIED_R_HOME": str(home),
           "EMBODIED_R_CHECKOUT": str(REPO), "PATH": f"{BIN}:{os.environ['PATH']}"}
    for key in ("PREFECT_API_KEY", "PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        env.pop(key, None)

    with ExitStack() as stack:
        _, prefect_port = stack.enter_context(serve_on_free_port(
            lambda port: [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            tmp_path / "prefect-server.log", env, ready_path="/api/health", timeout=180))
        _, mlflow_port = stack.enter_context(serve_on_free_port(
            lambda port: [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                          "--artifacts-destination", str(tmp_path / "mlartifacts"),
                          "--host", "127.0.0.1", "--port", str(port)],
            tmp_path / "mlflow-server.log", env, timeout=180))
        api = f"http://127.0.0.1:{prefect_port}/api"
        uri = f"http://127.0.0.1:{mlflow_port}"
        env.update({"PREFECT_API_URL": api, "MLFLOW_TRACKING_URI": uri})
        for key in ("PREFECT_HOME", "PREFECT_API_URL", "MLFLOW_TRACKING_URI", "EMBODIED_R_HOME"):
            monkeypatch.setenv(key, env[key])
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api}))
        _run(["bash", str(REPO / "infra" / "create-pools.sh")], env)
        _run([str(BIN / "prefect"), "--no-prompt", "deploy", "--all"], env)
        workers = [stack.enter_context(background(["bash", str(REPO / "infra" / "start-worker.sh"), pool],
                                                  tmp_path / f"worker-{pool}.log", env))
                   for pool in ("cpu", "gpu-infer", "gpu-train")]

        run = _wait_flow_run(_deployment_run(env, "embodied-r/full-pipeline", "recipe=smoke"), workers)
        logs = "".join(p.read_text()[-2000:] for p in tmp_path.glob("worker-*.log"))
        assert run.state.is_completed(), f"{run.state}\n{logs}"

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

        with get_client(sync_client=True) as client:
            subruns = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
            names = {client.read_flow(r.flow_id).name: r for r in subruns}
            assert set(names) == {f"embodied-r-{k}" for k in KINDS}
            assert all(r.state.is_completed() for r in subruns)
            pools = {n: r.work_pool_name for n, r in names.items()}
        assert pools["embodied-r-keyframes"] == "cpu"
        assert pools["embodied-r-perception"] == "gpu-infer"
        assert pools["embodied-r-train"] == "gpu-train"

        parents = _parents(uri)
        assert len(parents) == 1 and parents[0].data.tags["prefect.flow_run_id"] == str(run.id)
        children = _children(uri, parents[0].info.run_id)
        assert set(children) == STAGES
        assert all(c.info.status == "FINISHED" and c.data.metrics for c in children.values())
        assert any(k.startswith("accuracy/") for k in parents[0].data.metrics)
        # The trained reasoner was registered under the pipeline run (the smoke recipe's random
        # model is below chance, so it is not made champion).
        from mlflow import MlflowClient

        versions = MlflowClient(tracking_uri=uri).search_model_versions("name='embodied-r-reasoner'")
        assert [v.run_id for v in versions] == [parents[0].info.run_id]
        assert parents[0].data.tags["promoted"] == "false"

