"""End to end, as docs/running.md walks through it: real Prefect and MLflow servers on
127.0.0.1 started by the infra scripts, `infra/deploy.sh --recipe smoke`, a worker per pool
started as `&` starts it, the full pipeline and its page in the Prefect UI (headless Chromium),
one stage refreshed, the nightly's scheduled runs made by the server's own scheduler and one of
them run by a worker, and the workers stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

# Prefect reads its settings from the environment once, at import: import it before this test
# points the environment at its own servers, or every later test of the session would keep
# calling those servers once they are gone.
import prefect.context  # noqa: F401
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.servers import background, free_port, run_ok

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STAGES = {"download", "preprocess", "keyframes", "perception", "convert",
          "train_stage1", "train_stage2", "train_stage3", "evaluate", "promote"}
KINDS = ["download", "preprocess", "keyframes", "perception", "convert", "train", "evaluate", "promote"]
POOLS = ("cpu", "gpu-infer", "gpu-train")
DOC = REPO / "docs" / "running.md"
# What the test runs, as the walk-through writes it (the servers' ports aside).
DOCUMENTED = [
    "infra/start-prefect.sh", "infra/start-mlflow.sh", "infra/deploy.sh --recipe smoke",
    *(f"infra/start-worker.sh {pool}" for pool in POOLS),
    "prefect deployment run embodied-r/full-pipeline --param recipe=smoke --watch",
    "prefect deployment run embodied-r-evaluate/evaluate --param recipe=smoke --param refresh=true --watch",
    "embodied-r register-model --recipe smoke --alias champion",
]


def _watched_run(env: dict[str, str], name: str, *params: str) -> tuple[str, str]:
    """`prefect deployment run NAME --param ... --watch`, which exits 0 only when the run
    completes; the flow run's id and the link to it in the Prefect UI that the command printed."""
    args = [str(BIN / "prefect"), "deployment", "run", name]
    for p in params:
        args += ["--param", p]
    out = run_ok([*args, "--watch"], env, timeout=900)
    found, link = re.search(r"UUID:\s*([0-9a-f-]{36})", out), re.search(r"URL:\s*(\S+)", out)
    assert found and link, out
    return found.group(1), link.group(1)


def _flow_run_pages(links: dict[str, str], name: str, flow: str, shots: Path) -> None:
    """Each link opened in Prefect's UI in headless Chromium, where the page's heading must name
    the flow run, its flow and its final state; each page's screenshot under the name it maps to."""
    from tests.browser import Browser, ensure_chromium

    binary, why = ensure_chromium()
    if binary is None:
        pytest.skip(why)
    browser = Browser(binary, width=1500, height=1000)
    try:
        for link, shot in links.items():
            browser.open(link)
            # A wrong flow-run id opens "Page not found": no heading, and the wait says so.
            crumbs = browser.wait_for_texts(".page-heading .p-bread-crumbs__crumb", 2, timeout=60)
            state = browser.wait_for_texts(".page-heading .state-badge", 1, timeout=60)
            assert crumbs[-1] == name, (link, crumbs)
            assert state == ["Completed"], (link, state)
            # The flow's name comes from a query of its own, after the run's: waited for, not read at once.
            assert browser.wait_for_texts(".page-heading .flow-run-flow a", 1, timeout=60) == [flow], link
            browser.screenshot(shots / shot)
    finally:
        browser.close()


def _wait_flow_run(flow_run_id, workers: list, timeout: float = 300):
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


def _scheduled_runs(deployment: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter,
                                                FlowRunFilterState, FlowRunFilterStateType)
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        return client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))


def _stage_runs(uri: str, stage: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("embodied-r")
    return client.search_runs([exp.experiment_id], filter_string=f"tags.stage = '{stage}'")


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


def test_the_walk_through_names_what_the_end_to_end_test_runs():
    text = DOC.read_text(encoding="utf-8")
    missing = [cmd for cmd in DOCUMENTED if cmd not in text]
    assert not missing, f"docs/running.md no longer shows {missing}: the end-to-end test runs them"


def test_deploy_waits_for_the_server_then_says_in_one_line_how_to_start_it(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "infra" / "deploy.sh"), "--recipe", "smoke", "--wait", "3"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert time.monotonic() - started >= 3  # it waited before giving up
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert env["PREFECT_API_URL"] in lines[0] and "infra/start-prefect.sh" in lines[0]


def test_deploy_names_a_misspelt_recipe_before_deploying(tmp_path):
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    done = subprocess.run(["bash", str(REPO / "infra" / "deploy.sh"), "--recipe", "smok"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "smok" in done.stderr and "smoke" in done.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_the_walk_through_on_real_servers_and_workers(tmp_path, monkeypatch, subtests):
    home = tmp_path / "home"
    prefect_port, mlflow_port = free_port(), free_port()
    api, uri = f"http://127.0.0.1:{prefect_port}/api", f"http://127.0.0.1:{mlflow_port}"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "2", "EMBODIED_R_HOME": str(home), "PATH": f"{BIN}:{os.environ['PATH']}",
           "PREFECT_PORT": str(prefect_port), "MLFLOW_PORT": str(mlflow_port),
           "PREFECT_API_URL": api, "MLFLOW_TRACKING_URI": uri,
           # The scheduler's loop every 2 s instead of 60, so its first runs come within the test.
           "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2"}
    env.pop("PREFECT_API_KEY", None)
    for key in ("PREFECT_HOME", "PREFECT_API_URL", "MLFLOW_TRACKING_URI", "EMBODIED_R_HOME"):
        monkeypatch.setenv(key, env[key])
    server_log = tmp_path / "prefect-server.log"

    with ExitStack() as stack:
        # Started as the walk-through starts them, deploy.sh at once after: it waits.
        stack.enter_context(background(["bash", str(REPO / "infra" / "start-prefect.sh")], server_log, env))
        stack.enter_context(background(["bash", str(REPO / "infra" / "start-mlflow.sh")],
                                       tmp_path / "mlflow-server.log", env, ready_url=f"{uri}/health", timeout=180))
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api}))
        run_ok(["bash", str(REPO / "infra" / "deploy.sh"), "--recipe", "smoke"], env)
        workers = [stack.enter_context(background(["bash", str(REPO / "infra" / "start-worker.sh"), pool],
                                                  tmp_path / f"worker-{pool}.log", env, as_from_a_script=True))
                   for pool in POOLS]

        run_id, printed = _watched_run(env, "embodied-r/full-pipeline", "recipe=smoke")

        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

        with get_client(sync_client=True) as client:
            run = client.read_flow_run(run_id)
            subruns = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])))
            names = {client.read_flow(r.flow_id).name: r for r in subruns}
            assert set(names) == {f"embodied-r-{k}" for k in KINDS}
            assert all(r.state.is_completed() for r in subruns)
            pools = {n: r.work_pool_name for n, r in names.items()}
            # Each stage's flow run was handed the pipeline's plan: nothing on the pools plans again.
            assert all(r.parameters["plan"]["stages"] for r in subruns)
            assert {json.dumps(r.parameters["plan"], sort_keys=True) for r in subruns} == {
                json.dumps(subruns[0].parameters["plan"], sort_keys=True)}
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

        # The flow run's page in the Prefect UI, from the link the command printed and the one in
        # the MLflow run's description: the run by name, completed. Its own subtest, so that a
        # machine without Chromium skips this page alone, by name.
        note = parents[0].data.tags["mlflow.note.content"]
        described = re.search(r"Prefect flow run: \[[^\]]*\]\(([^)]+)\)", note)
        assert described, note
        pages = {printed: "prefect-flow-run-from-printed-link.png"}
        pages.setdefault(described.group(1), "prefect-flow-run-from-mlflow-description.png")
        with subtests.test("the flow run's page in the Prefect UI"):
            shots = Path(os.environ.get("EMBODIED_R_SCREENSHOTS") or tmp_path)
            _flow_run_pages(pages, run.name, "embodied-r", shots)

        # The whole pipeline again: every stage is done, so no stage is sent to a pool.
        again, _ = _watched_run(env, "embodied-r/full-pipeline", "recipe=smoke")
        with get_client(sync_client=True) as client:
            assert not client.read_flow_runs(flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[again])))
        said = (tmp_path / "worker-cpu.log").read_text(errors="replace")
        assert all(f"[stage] {stage:<13} cached" in said for stage in STAGES)
        assert "not sent to pool gpu-train" in said

        # One stage refreshed through its own deployment: evaluate computed a second time.
        _watched_run(env, "embodied-r-evaluate/evaluate", "recipe=smoke", "refresh=true")
        computed = [r for r in _stage_runs(uri, "evaluate") if r.data.tags.get("cache_hit") != "true"]
        assert len(computed) == 2

        # The server's scheduler has made the nightly's coming runs, with the recipe deployed.
        scheduled = _scheduled_runs("embodied-r-reevaluate/nightly")
        assert scheduled, f"no scheduled nightly run; server log:\n{server_log.read_text()[-3000:]}"
        assert all(r.parameters["recipe"] == "smoke" for r in scheduled)
        # Given a champion, one of them brought forward to now is run by the gpu-infer worker.
        run_ok([str(BIN / "embodied-r"), "register-model", "--recipe", "smoke", "--alias", "champion"], env)
        from prefect.states import Scheduled

        nightly = min(scheduled, key=lambda r: r.expected_start_time)
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(nightly.id, Scheduled(scheduled_time=datetime.now(timezone.utc)), force=True)
        done = _wait_flow_run(nightly.id, workers)
        assert done.state.is_completed() and done.state.name == "Completed", done.state
        scored = [r for r in _stage_runs(uri, "reevaluate") if r.data.tags["prefect.flow_run_id"] == str(nightly.id)]
        assert len(scored) == 1 and "accuracy/overall" in scored[0].data.metrics

        # Every service of the server ran without an error of its own. SQLite's "database is
        # locked" under a busy machine is retried by the server on its next beat, and is no fault
        # of a service; anything else (SQLAlchemy 2.1's bulk DML error among them) is.
        entries = re.split(r"\n(?=\d\d:\d\d:\d\d\.\d+ \| )", server_log.read_text(errors="replace"))
        errors = [e for e in entries if ("| ERROR" in e or "Traceback" in e) and "database is locked" not in e]
        assert not errors, "\n\n".join(errors[:5])

        # A worker started with `&` stops on SIGTERM, as `kill` or a supervisor sends it.
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            worker.wait(timeout=60)
