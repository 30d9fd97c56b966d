"""Things lost under a run: a tracking server that does not answer or dies mid-run, and a
finished stage folder that lost a file.

A tracking server that does not answer is named in one line within seconds, at ``validate``
and before the first stage (a closed port on 127.0.0.1). One killed mid-run (a real ``mlflow
server``, kill -9 while perception works) costs no work: the run goes on untracked, says so
in one line, and a rerun with the server back logs every stage without redoing any. A
finished folder that lost a file (removed, or truncated) is not taken as done: the run stops
in one line naming ``--refresh`` where that would redo training, and otherwise recomputes it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied_r.apps.cli import main
from tests.servers import background, free_port, serve_on_free_port
from tests.flows.test_interrupts import _cli, _env, _run

ROOT = Path(__file__).resolve().parents[2]
MLFLOW = Path(sys.executable).parent / "mlflow"
# The smoke recipe with one GRPO stage: the same plumbing, two trainer launches fewer a run.
ONE_STAGE = ["--set", "training.stages=[{name: stage1, epochs: 1, rewards: {format: 0.7, accuracy: 0.3, "
                      "consistency: 0.0}}]"]


def _one_line(text: str) -> str:
    text = text.strip()
    assert text.count("\n") == 0 and "Traceback" not in text, text[-3000:]
    return text


# -- a tracking server that does not answer ------------------------------------------------

def test_a_tracking_server_that_does_not_answer_is_named_at_validate_and_before_the_first_stage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["validate", "--recipe", "smoke"]) == 2
    err = _one_line(capsys.readouterr().err)
    for needle in (uri, "infra/start-mlflow.sh", "MLFLOW_TRACKING_URI"):
        assert needle in err, err
    home = tmp_path / "home"
    done = _run(home, "run", "--recipe", "smoke", timeout=120, MLFLOW_TRACKING_URI=uri)
    assert done.returncode == 2, done.stderr[-3000:]
    assert _one_line(done.stderr) == err
    assert not (home / "stages").exists()


def test_a_store_that_accepts_but_never_answers_is_named_too() -> None:
    from embodied_r.errors import TrackingUnavailable
    from embodied_r.tracking.store import check_store

    with socket.socket() as silent:  # connections queue in its backlog and are never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(TrackingUnavailable) as caught:
            check_store(uri, timeout_s=0.5)
    assert uri in str(caught.value) and "does not answer" in str(caught.value)
    check_store("sqlite:////nowhere/mlflow.db")  # a local store needs no server


def test_calls_to_a_store_that_stopped_answering_fail_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that answered, then went away: the next write finds it gone before it is sent
    (MLflow's client would retry it for minutes) and is kept in the home's outbox; a read waits
    for the server up to the bound, then fails as lost, and every later read fails at once."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import threading
    import time

    from embodied_r.errors import TrackingLost
    from embodied_r.tracking.link import link, tracking_lost
    from embodied_r.tracking.runs import Tracker
    from embodied_r.tracking.store import check_store

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args: Any) -> None:
            pass

    monkeypatch.setenv("EMBODIED_R_HOME", str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    check_store(uri)
    server.shutdown()
    server.server_close()
    store = link(uri)
    store.bound_s = 1.0

    class NotSent:
        def __getattr__(self, name: str) -> Any:
            def sent(*args: Any, **kwargs: Any) -> None:
                raise AssertionError(f"{name} was sent to a server that is gone")

            return sent

    monkeypatch.setattr(store, "_client", NotSent())
    tracker = Tracker(uri, "0", "run")
    tracker.log_metrics("run", {"x": 1.0})
    assert [op["op"] for _, op in store.box.pending()] == ["batch"] and not tracking_lost(uri)
    with pytest.raises(TrackingLost) as first:
        tracker.client.get_run("run")
    assert uri in str(first.value) and tracking_lost(uri)
    started = time.monotonic()
    with pytest.raises(TrackingLost):
        tracker.client.get_run("run")
    assert time.monotonic() - started < 0.5


# -- a finished stage folder that lost a file -----------------------------------------------

def _finished(folder: Path, files: dict[str, Any]) -> Path:
    """A finished stage folder holding ``files`` (a list of rows makes a Parquet file)."""
    from embodied_r.io import write_summary

    folder.mkdir(parents=True)
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, list):
            pq.write_table(pa.Table.from_pylist(content), path)
        else:
            path.write_text(content)
    write_summary(folder, {"done": 1})
    return folder


def test_a_finished_folder_records_its_outputs_and_names_what_it_lost(tmp_path: Path) -> None:
    from embodied_r.io import damaged_outputs, read_summary
    from embodied_r.tracking.names import stage_metrics

    rows = [{"id": i, "text": "x" * 50} for i in range(200)]
    folder = _finished(tmp_path / "stage", {"train.parquet": rows, "test.parquet": rows[:20],
                                            "notes.json": "{}", "model/weights.bin": "w" * 99})
    outputs = read_summary(folder)["outputs"]
    assert outputs["train.parquet"]["rows"] == 200 and outputs["model/"] == {"files": 1, "bytes": 99}
    assert not any("outputs" in name for name in stage_metrics(read_summary(folder)))
    assert damaged_outputs(folder) == []
    (folder / "train.parquet").unlink()
    data = (folder / "test.parquet").read_bytes()
    (folder / "test.parquet").write_bytes(data[: len(data) // 2])
    (folder / "model" / "weights.bin").write_text("w")
    assert damaged_outputs(folder) == [  # in the order of the folder's names
        "model/ holds 1 file of 1 byte, not 1 of 99",
        f"test.parquet has {len(data) // 2} bytes, not {len(data)}",
        "train.parquet is missing"]
    # A folder finished by older code, which recorded nothing, is taken as it is.
    old = tmp_path / "old"
    old.mkdir()
    (old / "summary.json").write_text(json.dumps({"done": 1}))
    assert damaged_outputs(old) == []


def _smoke_stages(home: Path, only: list[str]) -> dict[str, Any]:
    """The smoke recipe's stages, those named finished in their folders (real files)."""
    from embodied_r.config import load_recipe
    from embodied_r.pipeline import plan

    stages = plan(load_recipe("smoke"), home)
    for name in only:
        _finished(Path(stages[name].out), {"records.parquet": [{"id": 1}, {"id": 2}], "model/w": "w"})
    return stages


def test_a_damaged_cheap_stage_is_recomputed_with_its_dependants(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from flows.runner import discard_damaged

    stages = _smoke_stages(tmp_path, ["download", "preprocess", "keyframes", "perception", "convert"])
    (Path(stages["preprocess"].out) / "records.parquet").write_bytes(b"PAR1")  # truncated
    # Its dependants keyframes (done) and convert run again; perception, a GPU stage, is done
    # and reads it: recomputing it is not done unasked.
    with pytest.raises(Exception) as caught:
        discard_damaged(stages, list(stages))
    assert type(caught.value).__name__ == "DamagedOutput"
    message = str(caught.value)
    assert "preprocess" in message and "records.parquet" in message and "--refresh preprocess" in message
    assert "perception" in message and all(stages[n].complete for n in ("preprocess", "keyframes", "convert"))
    # With perception not yet done, the damaged stage and its finished dependants are discarded.
    from flows.runner import discard

    discard(Path(stages["perception"].out))
    capsys.readouterr()
    assert discard_damaged(stages, list(stages)) == ["preprocess", "keyframes", "convert"]
    said = capsys.readouterr().out.strip()
    assert said.count("\n") == 0 and "preprocess" in said and "records.parquet" in said, said
    assert not any(stages[n].complete for n in ("preprocess", "keyframes", "convert"))
    assert stages["download"].complete


def test_only_the_folders_a_run_relies_on_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from flows.runner import discard_damaged

    stages = _smoke_stages(tmp_path, ["download", "preprocess"])
    (Path(stages["download"].out) / "records.parquet").unlink()
    assert main(["--home", str(tmp_path), "plan", "--recipe", "smoke"]) == 0
    shown = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert shown["download"] == "damaged" and shown["preprocess"] == "done", shown
    # `embodied-r preprocess` on a finished preprocess reads nothing of download.
    assert discard_damaged(stages, ["preprocess"]) == []
    assert discard_damaged(stages, ["download", "preprocess"]) == ["download", "preprocess"]


def test_a_missing_input_is_not_retried() -> None:
    from prefect.states import Failed

    from tasks.stages import _worth_retrying

    def failed(exc: BaseException) -> Any:
        return Failed(data=exc)

    assert not _worth_retrying(None, None, failed(FileNotFoundError("train.parquet does not exist")))
    assert not _worth_retrying(None, None, failed(pa.ArrowInvalid("Parquet magic bytes not found")))
    assert _worth_retrying(None, None, failed(RuntimeError("training failed (exit code 1)")))


# -- real runs: a tracking server killed mid-run, then folders that lost files ---------------

def _mlflow(store: Path, port: int) -> list[str]:
    return [str(MLFLOW), "server", "--backend-store-uri", f"sqlite:///{store / 'server.db'}",
            "--artifacts-destination", str(store / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]


def _stage_lines(text: str, event: str) -> list[str]:
    return [line.split()[1] for line in text.splitlines() if line.startswith("[stage]") and f" {event} " in line + " "]


def killed_mid_run(root: Path) -> dict[str, Any]:
    """The smoke run (one GRPO stage) against a real MLflow server that is killed (kill -9)
    once perception is under way: a stage with no MLflow call in flight until it ends."""
    store, home = root / "store", root / "home"
    store.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    with serve_on_free_port(lambda port: _mlflow(store, port), root / "server.log", env, timeout=180) as (server, port):
        uri = f"http://127.0.0.1:{port}"
        with open(root / "stderr.txt", "w") as err:
            # The server never comes back: the run waits for it only briefly (``tracking.outage_s``).
            proc = subprocess.Popen(_cli("run", "--recipe", "smoke", *ONE_STAGE, "--set", "tracking.outage_s=10"),
                                    env=_env(home, MLFLOW_TRACKING_URI=uri),
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[stage] perception") and " started" in line:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
                break
        try:
            rest, _ = proc.communicate(timeout=480)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"root": root, "home": home, "store": store, "port": port, "uri": uri, "rc": proc.returncode,
            "stdout": "".join(lines) + rest, "stderr": (root / "stderr.txt").read_text()}


def rerun_with_server_back(lost: dict[str, Any]) -> tuple[subprocess.CompletedProcess, list[Any], list[Any]]:
    """The same run again with the server back on its port and store: the rerun's output,
    the parent runs in start order, and the last parent's children."""
    from mlflow import MlflowClient

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    port, uri = lost["port"], lost["uri"]
    with background(_mlflow(lost["store"], port), lost["root"] / "server2.log", env,
                    ready_url=f"{uri}/health", timeout=180):
        again = _run(lost["home"], "run", "--recipe", "smoke", *ONE_STAGE, timeout=480, MLFLOW_TRACKING_URI=uri)
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("embodied-r").experiment_id
        parents = [r for r in client.search_runs([experiment], order_by=["attributes.start_time ASC"])
                   if "mlflow.parentRunId" not in r.data.tags]
        children = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parents[-1].info.run_id}'")
    return again, parents, children


@pytest.fixture(scope="module")
def lost_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not MLFLOW.exists():
        pytest.skip("the mlflow command is not installed")
    return killed_mid_run(tmp_path_factory.mktemp("lost"))


def planned(lost: dict[str, Any]) -> dict[str, Any]:
    """The run's plan as the run made it: promotion is keyed by the MLflow store it promotes in."""
    from embodied_r.config import load_recipe, parse_overrides
    from embodied_r.pipeline import plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", lost["uri"])
        return plan(load_recipe("smoke", parse_overrides(ONE_STAGE[1:])), lost["home"])


@pytest.mark.slow
@pytest.mark.e2e
def test_a_tracking_server_killed_mid_run_costs_no_work(lost_run: dict[str, Any]) -> None:
    out, err, uri = lost_run["stdout"], lost_run["stderr"], lost_run["uri"]
    assert lost_run["rc"] == 1, out[-3000:] + err[-3000:]
    line = _one_line(err)
    assert "tracking lost" in line and uri in line and "infra/start-mlflow.sh" in line and "rerun" in line, line
    assert sum("tracking lost" in t for t in out.splitlines()) == 1, out[-3000:]
    stages = planned(lost_run)
    # Every stage's work is done but promotion's, whose result lives in the lost store: it is
    # left to the rerun, not failed on and not marked done.
    computed = [n for n in stages if n != "promote"]
    assert all(stages[n].complete for n in computed) and not stages["promote"].complete
    assert _stage_lines(out, "done") == computed and _stage_lines(out, "skipped") == ["promote"]
    # The server back on its port: the rerun logs every stage, computing none but promotion.
    again, parents, children = rerun_with_server_back(lost_run)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _stage_lines(again.stdout, "started") == ["promote"] and _stage_lines(again.stdout, "cached") == computed
    assert [p.info.status for p in parents] == ["KILLED", "FINISHED"]
    assert sorted(c.data.tags["stage"] for c in children) == sorted(stages)
    assert {c.info.status for c in children} == {"FINISHED"}
    evaluate = next(c for c in children if c.data.tags["stage"] == "evaluate")
    assert "accuracy/overall" in evaluate.data.metrics


@pytest.mark.slow
@pytest.mark.e2e
def test_a_finished_folder_that_lost_a_file_is_not_taken_as_done(lost_run: dict[str, Any]) -> None:
    home = lost_run["home"]
    stages = planned(lost_run)
    assert all(sp.complete for sp in stages.values())
    convert = Path(stages["convert"].out)
    data = (convert / "test.parquet").read_bytes()
    (convert / "test.parquet").write_bytes(data[: len(data) // 2])
    # Recomputing convert would redo the GRPO stage: the run stops at once, naming the flag.
    stopped = _run(home, "run", "--recipe", "smoke", *ONE_STAGE)
    assert stopped.returncode == 1, stopped.stdout[-3000:]
    line = _one_line(stopped.stderr)
    assert "test.parquet" in line and "--refresh convert" in line and "train_stage1" in line, line
    assert _stage_lines(stopped.stdout, "started") == []
    # Refreshing the GRPO stage, with a file of convert removed as well: convert is done again,
    # said in one line, and nothing is retried.
    (convert / "train.parquet").unlink()
    refreshed = _run(home, "run", "--recipe", "smoke", *ONE_STAGE, "--refresh", "train_stage1")
    assert refreshed.returncode == 0, refreshed.stdout[-3000:] + refreshed.stderr[-3000:]
    said = [t for t in refreshed.stdout.splitlines() if "train.parquet" in t]
    assert len(said) == 1 and "convert" in said[0] and "test.parquet" in said[0], said
    assert _stage_lines(refreshed.stdout, "started") == ["convert", "train_stage1", "evaluate", "promote"]
    assert pq.read_table(convert / "test.parquet").num_rows > 0 and (convert / "train.parquet").is_file()
