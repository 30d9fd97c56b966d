"""A real ``mlflow server`` whose process group is killed -9 as ``train_stage1`` starts. Back
within ``tracking.outage_s``, the run ends 0 with one line, every run holding what an
uninterrupted run holds; past it, the run says tracking was lost, exits 1, and the rerun restores
each stage's own record, step curves included. A run with an HTTP store prints no MLflow line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.servers import free_port, wait_http
from tests.flows.test_interrupts import ROOT, _cli, _env, _run

MLFLOW = Path(sys.executable).parent / "mlflow"
# The smoke recipe with one GRPO stage and fewer, shorter videos: the same plumbing, quicker.
SMALL = ["--set", "training.stages=[{name: stage1, epochs: 1, rewards: {format: 0.7, accuracy: 0.3, "
                  "consistency: 0.0}}]",
         "--set", "download.synthetic={urban_videos: 8, clips_per_scene: 2, vsi_scenes: 1, seconds: 4}",
         "--set", "keyframes.max_frames=4"]
RAN = ("train_stage1", "evaluate", "promote")  # what a refresh of train_stage1 computes again
AWAY_S = 20.0

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.skipif(not MLFLOW.exists(), reason="the mlflow command is not installed")]


class Server:
    """``mlflow server`` on 127.0.0.1 in a process group of its own (its uvicorn workers outlive
    their master: only killing the group stops it), on one port and one store across restarts."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        cmd = [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
               "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
               "--port", str(self.port)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        log = self.root / f"server{self.starts}.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_http(f"{self.uri}/health", 240, self.proc, log)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def runs(self) -> tuple[list[Any], dict[str, list[Any]]]:
        """The parent runs in start order, and each parent's children by its id."""
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        experiment = client.get_experiment_by_name("embodied-r").experiment_id
        found = client.search_runs([experiment], order_by=["attributes.start_time ASC"], max_results=500)
        parents = [r for r in found if "mlflow.parentRunId" not in r.data.tags]
        return parents, {p.info.run_id: [r for r in found if r.data.tags.get("mlflow.parentRunId") == p.info.run_id]
                         for p in parents}


def record(uri: str, run: Any) -> dict[str, list[int]]:
    """A run's metric keys, each with the steps of its history."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return {key: sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) for key in run.data.metrics}


def distinct(held: dict[str, list[int]]) -> dict[str, list[int]]:
    """Each key's steps, each once: a cached run logs its summary's figures beside the copy."""
    return {key: sorted(set(steps)) for key, steps in held.items()}


def by_stage(children: list[Any]) -> dict[str, Any]:
    return {c.data.tags["stage"]: c for c in children}


def killed_in_train_stage1(home: Path, server: Server, back_after_s: float | None, *extra: str) -> dict[str, Any]:
    """``embodied-r run`` refreshing train_stage1, the server's group killed -9 once that stage
    started (before its trainer logs a step) and, with ``back_after_s``, started again that much
    later, or once the stage ended if that is later: both the trainer and the run write while the
    server is gone."""
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(_cli("run", "--recipe", "smoke", *SMALL, "--refresh", "train_stage1", *extra),
                            env=_env(home, MLFLOW_TRACKING_URI=server.uri), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=err, text=True)
    assert proc.stdout is not None
    lines, killed_at, restart = [], None, None
    for line in proc.stdout:
        lines.append(line)
        if not line.startswith("[stage] train_stage1"):
            continue
        if killed_at is None and " started" in line:
            server.kill()
            killed_at = time.monotonic()
        elif killed_at is not None and " done " in line and back_after_s is not None and restart is None:
            wait = max(0.0, back_after_s - (time.monotonic() - killed_at))
            restart = threading.Thread(target=lambda: (time.sleep(wait), server.start()))
            restart.start()
    proc.wait(timeout=900)
    if restart is not None:
        restart.join()
    err.seek(0)
    return {"rc": proc.returncode, "stdout": "".join(lines), "stderr": err.read(), "killed": killed_at is not None}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A home where the small smoke run finished against a server that stayed up: the record of
    an uninterrupted run, each stage's and the parent's."""
    root = tmp_path_factory.mktemp("outage")
    server = Server(root / "reference")
    server.root.mkdir()
    server.start()
    try:
        done = _run(root / "home", "run", "--recipe", "smoke", *SMALL, timeout=1500, MLFLOW_TRACKING_URI=server.uri)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        parents, children = server.runs()
        stages = by_stage(children[parents[-1].info.run_id])
        held = {name: record(server.uri, run) for name, run in stages.items()}
        held["parent"] = record(server.uri, parents[-1])
        params = {name: set(run.data.params) for name, run in stages.items()}
    finally:
        server.kill()
    assert held["train_stage1"]["reward/total"] == [1, 2, 3], held["train_stage1"]
    return {"root": root, "home": root / "home", "held": held, "params": params, "said": done}


def test_a_run_with_an_http_store_prints_no_line_of_mlflows_own(reference: dict[str, Any]) -> None:
    """MLflow's run and experiment links and its registry's wait never reach the console; the
    project's own links close the run, and the libraries' INFO lines are in the run's log."""
    done = reference["said"]
    text = done.stdout + done.stderr
    for theirs in ("View run", "View experiment", "Waiting up to", " INFO mlflow", "🏃", "🧪"):
        assert theirs not in text, [line for line in text.splitlines() if theirs in line][:3]
    assert "This run in MLflow: http://127.0.0.1:" in done.stdout and "All runs, headline columns:" in done.stdout
    log = Path(next(line for line in done.stdout.splitlines() if line.startswith("Run log:")).split()[2])
    assert "Waiting up to" in log.read_text(), log


def test_a_server_back_within_the_bound_is_ridden_out(reference: dict[str, Any]) -> None:
    server = Server(reference["root"] / "within")
    server.root.mkdir()
    server.start()
    try:
        run = killed_in_train_stage1(reference["home"], server, AWAY_S)
        assert run["killed"], run["stdout"][-3000:]
        assert run["rc"] == 0, run["stdout"][-3000:] + run["stderr"][-3000:]
        said = [line for line in run["stdout"].splitlines() if "MLflow server" in line or "tracking" in line]
        assert len(said) == 1 and "was away for" in said[0] and "every value was sent" in said[0], said
        away = float(said[0].split("was away for ")[1].split(" s")[0])
        assert away >= AWAY_S - 5, said
        assert "tracking lost" not in run["stdout"] + run["stderr"]
        assert not list((reference["home"] / "mlflow-outbox").glob("*/ops-*.jsonl")), "writes left unsent"
        parents, children = server.runs()
        assert [p.info.status for p in parents] == ["FINISHED"]
        stages = by_stage(children[parents[0].info.run_id])
        assert {c.info.status for c in stages.values()} == {"FINISHED"}
        assert record(server.uri, parents[0]) == reference["held"]["parent"]
        for name in RAN:
            assert record(server.uri, stages[name]) == reference["held"][name], name
            assert set(stages[name].data.params) == reference["params"][name], name
    finally:
        server.kill()
    print(f"\nwithin the bound: away {away:.0f} s; " + "; ".join(
        f"{n} {len(reference['held'][n])} keys, steps {sorted({s for v in reference['held'][n].values() for s in v})}"
        for n in RAN))


def test_a_server_back_past_the_bound_is_lost_and_the_rerun_restores_every_record(reference: dict[str, Any]) -> None:
    server = Server(reference["root"] / "past")
    server.root.mkdir()
    server.start()
    try:
        run = killed_in_train_stage1(reference["home"], server, None, "--set", "tracking.outage_s=15")
        assert run["killed"], run["stdout"][-3000:]
        assert run["rc"] == 1, run["stdout"][-3000:] + run["stderr"][-3000:]
        line = run["stderr"].strip()
        assert line.count("\n") == 0 and "tracking lost at train_stage1" in line and server.uri in line, line
        assert "rerun" in line and "infra/start-mlflow.sh" in line, line
        assert sum("tracking lost" in t for t in run["stdout"].splitlines()) == 1, run["stdout"][-3000:]
        server.start()
        again = _run(reference["home"], "run", "--recipe", "smoke", *SMALL, timeout=900,
                     MLFLOW_TRACKING_URI=server.uri)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        parents, children = server.runs()
        assert [p.info.status for p in parents] == ["KILLED", "FINISHED"]
        lost, rerun = (by_stage(children[p.info.run_id]) for p in parents)
        # The lost run's own stage runs, sent by the rerun from what the lost run kept.
        assert {lost[n].info.status for n in ("train_stage1", "evaluate")} == {"FINISHED"}
        assert record(server.uri, lost["train_stage1"]) == reference["held"]["train_stage1"]
        assert {c.info.status for c in rerun.values()} == {"FINISHED"}
        for name in ("train_stage1", "evaluate"):
            assert rerun[name].data.tags["cache_hit"] == "true"
            assert rerun[name].data.tags["source_run_id"] == lost[name].info.run_id
            assert distinct(record(server.uri, rerun[name])) == distinct(reference["held"][name]), name
        assert record(server.uri, parents[1]) == reference["held"]["parent"]
        held = record(server.uri, rerun["train_stage1"])
    finally:
        server.kill()
    print(f"\npast the bound: the rerun's train_stage1 holds {len(held)} keys, steps "
          f"{sorted({s for v in held.values() for s in v})}")
