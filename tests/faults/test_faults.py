"""Faults and bad input: outages are not cached, resumes recover, bad numbers are refused.

Real servers on 127.0.0.1 (the scripted stub), real files and real processes; client
timeouts are 5 s or more so a loaded machine does not turn a test into a fault of its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied_r.backends.base import BackendConfig
from embodied_r.backends.openai_compat import OpenAIBackend
from embodied_r.errors import (CatalogError, DataSourceError, InfraFailure, RecipeError, StageBusy, TooManyFailures,
                               VideoError)
from embodied_r.io import ItemLog, stage_folder
from embodied_r.perception.stage import run_perception
from embodied_r.redaction import redact
from tests.killing import cut_short, write_checkpoints
from tests.servers import ChatStub, StubReply, completion
from tests.perception.test_perception import make_inputs
from tests.perception.test_perception_http import RecordingServer, stage_cfg

CONVERSATION = [{"role": "user", "content": "hi"}]


# -- redaction -------------------------------------------------------------------------

@pytest.mark.parametrize("text, secret", [
    ("echo: Authorization: Bearer sk-abc123def456ghi789", "sk-abc123def456ghi789"),
    ("headers {'authorization': 'bearer eyJhbGciOiJIUzI1NiJ9.payload.sig'}", "eyJhbGciOiJIUzI1NiJ9.payload.sig"),
    ("bad key hf_AbCdEfGhIjKlMnOpQrSt given", "hf_AbCdEfGhIjKlMnOpQrSt"),
    ('{"api_key": "my-very-secret-value"}', "my-very-secret-value"),
    ("url?access_token=qwertyuiop123&x=1", "qwertyuiop123"),
])
def test_redact_removes_tokens_and_keys(text: str, secret: str) -> None:
    out = redact(text)
    assert secret not in out and "[REDACTED]" in out


def test_redact_keeps_ordinary_error_text() -> None:
    text = "HTTP 500: overloaded; retry later (tokens used: 12)"
    assert redact(text) == text and redact(None) is None


# -- the backend tells an outage from a bad item ---------------------------------------

def _backend(url: str, **kw: Any) -> OpenAIBackend:
    cfg = BackendConfig(kind="openai", model="m", base_url=url, timeout_s=5.0, max_retries=kw.pop("retries", 0),
                        api_key_env="EMBODIED_R_TEST_FAULT_KEY", **kw)
    return OpenAIBackend(cfg, backoff_base_s=0.05, backoff_max_s=0.1)


@pytest.mark.parametrize("reply, kind", [
    (StubReply(status=500, payload={"error": "down"}), "infra"),
    (StubReply(status=429, payload={"error": "slow down"}), "infra"),
    (StubReply(status=401, payload={"error": "bad key"}), "infra"),
    (StubReply(status=400, payload={"error": "prompt too long"}), "item"),
    (StubReply(payload="<html>not json</html>"), "infra"),
])
def test_backend_classifies_failures(reply: StubReply, kind: str) -> None:
    stub = ChatStub(lambda body: reply)
    backend = _backend(stub.base_url, retries=1)
    try:
        gen = backend.generate([CONVERSATION])[0]
    finally:
        backend.close()
        stub.stop()
    assert gen.error and gen.error_kind == kind


def test_an_echoed_key_never_reaches_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBODIED_R_TEST_FAULT_KEY", "sk-live-0123456789abcdef")
    stub = ChatStub(lambda body: StubReply(status=400, payload={"error": f"bad request, headers: {stub.auth[-1]}"}))
    backend = _backend(stub.base_url)
    try:
        gen = backend.generate([CONVERSATION])[0]
    finally:
        backend.close()
        stub.stop()
    assert "Bearer" in gen.error and "sk-live-0123456789abcdef" not in gen.error


def test_reply_content_that_is_not_text_is_malformed() -> None:
    body = completion("m", "x")
    body["choices"][0]["message"]["content"] = [{"type": "text", "text": "a list"}]
    stub = ChatStub(lambda b: StubReply(payload=body))
    backend = _backend(stub.base_url)
    try:
        gen = backend.generate([CONVERSATION])[0]
    finally:
        backend.close()
        stub.stop()
    assert gen.error and "not text" in gen.error and gen.text == ""


# -- perception: an outage stops the stage, the rerun sends only what is missing -------

def test_perception_outage_stays_partial_and_resumes(tmp_path: Path) -> None:
    catalog, kf = make_inputs(tmp_path, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    out = tmp_path / "out"
    down = RecordingServer(fault=lambda body: (500, "down"))
    cfg = stage_cfg(down, "per_question")
    cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"max_retries": 1})})
    try:
        with pytest.raises(InfraFailure, match="run again"):
            run_perception(catalog, kf, out, cfg)
    finally:
        down.stop()
    assert not out.exists() and (tmp_path / "out.partial").is_dir()
    assert len(down.bodies) <= 8 * 2  # 8 calls, each at most its retry budget

    up = RecordingServer()
    try:
        summary = run_perception(catalog, kf, out, stage_cfg(up, "per_question"))
    finally:
        up.stop()
    assert summary["done"] == 3 and summary["failed"] == 0 and (out / "summary.json").is_file()


def test_too_many_failed_items_fail_the_stage(tmp_path: Path) -> None:
    catalog, kf = make_inputs(tmp_path, {"a": 2}, [("q:1", "a"), ("q:2", "nope")])
    srv = RecordingServer()
    try:
        with pytest.raises(TooManyFailures, match="1 of 2"):
            run_perception(catalog, kf, tmp_path / "out", stage_cfg(srv, "per_question"))
    finally:
        srv.stop()
    assert not (tmp_path / "out").exists() and (tmp_path / "out.partial" / "failures.parquet").is_file()


# -- replay is checked ------------------------------------------------------------------

def test_item_log_drops_entries_that_fail_their_schema(tmp_path: Path) -> None:
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"key": "a", "raw": ["not", "text"]}) + "\n"
                    + json.dumps({"key": "b", "raw": "fine"}) + "\n" + "[1, 2]\n" + '{"no_key": 1}\n')
    log = ItemLog(path, key="key", validate=lambda r: isinstance(r.get("raw"), str))
    assert [r["key"] for r in log.read()] == ["b"] and log.dropped == 3
    log.append({"key": "a", "raw": "redone"})
    assert {r["key"]: r["raw"] for r in log.read()} == {"a": "redone", "b": "fine"}


def test_checkpoint_cut_short_falls_back_to_the_previous(tmp_path: Path) -> None:
    from embodied_r.training.checkpoints import last_checkpoint

    base = tmp_path / "checkpoints"
    last = write_checkpoints(base, optimizer=True)
    assert last_checkpoint(tmp_path) == (str(base / "checkpoint-4"), 4)
    cut_short(last)
    assert last_checkpoint(tmp_path) == (str(base / "checkpoint-2"), 2)
    assert not (base / "checkpoint-4").exists()


# -- videos, recipes, preprocess --------------------------------------------------------

def test_truncated_video_is_recorded_with_both_counts(tmp_path: Path) -> None:
    import cv2
    import numpy as np

    from embodied_r.keyframes.extract import extract_keyframes
    from embodied_r.keyframes.config import KeyframeConfig

    path = tmp_path / "v.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    rng = np.random.default_rng(0)
    for _ in range(60):
        writer.write(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    writer.release()
    data = bytearray(path.read_bytes())
    start, end = len(data) // 3, 2 * len(data) // 3
    data[start:end] = bytes(end - start)  # zeroed mid-stream; later frames and the index intact
    path.write_bytes(bytes(data))
    with pytest.raises(VideoError) as err:
        extract_keyframes(path, KeyframeConfig(workers=1))
    assert err.value.code == "truncated" and "of the 60 frames" in str(err.value)


@pytest.mark.parametrize("override", [
    {"training": {"learning_rate": -1}}, {"training": {"learning_rate": 0}}, {"training": {"learning_rate": float("nan")}},
    {"training": {"learning_rate": float("inf")}}, {"perception": {"backend": {"temperature": -3}}},
    {"perception": {"backend": {"timeout_s": 0}}}, {"evaluation": {"backend": {"max_new_tokens": 0}}},
    {"download": {"max_zip_bytes": -5}}, {"catalog": {"split": {"train": 0.9, "val": 0.9, "test": -0.8}}},
    {"evaluation": {"split": "holdout"}},
    {"training": {"stages": [{"name": "../../../evil", "rewards": {"format": 1}}]}},
    {"perception": {"max_failed_fraction": 1.5}},
])
def test_recipes_refuse_nonsense(override: dict) -> None:
    from embodied_r.config import load_recipe

    with pytest.raises(RecipeError):
        load_recipe("smoke", override)


def test_extends_resolves_beside_the_recipe_and_set_errors_are_one_line(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from embodied_r.config import load_recipe, parse_override

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "base.yaml").write_text("extends: demo\ndescription: the right base\n")
    (tmp_path / "r" / "mine.yaml").write_text("extends: base.yaml\n")
    (tmp_path / "base.yaml").write_text("extends: demo\ndescription: a stranger's base\n")
    monkeypatch.chdir(tmp_path)
    assert load_recipe(tmp_path / "r" / "mine.yaml").description == "the right base"
    with pytest.raises(RecipeError) as err:
        parse_override("training.learning_rate=[1,2")
    assert "\n" not in str(err.value) and "learning_rate" in str(err.value)


def _mirror(tmp_path: Path, table: pa.Table) -> Path:
    from embodied_r.benchmarks import urbanvideo

    folder = tmp_path / "raw" / urbanvideo.BENCHMARK.folder
    folder.mkdir(parents=True)
    pq.write_table(table, folder / urbanvideo.FILE)
    return folder


def test_preprocess_rejects_duplicate_ids_naming_them(tmp_path: Path) -> None:
    from embodied_r.benchmarks import urbanvideo

    row = {"video_id": "v.mp4", "question_category": "Counterfactual", "question": "Q? A. x B. y", "answer": "A"}
    table = pa.Table.from_pylist([{"Question_id": 7, **row}, {"Question_id": 7, **row}, {"Question_id": 8, **row}])
    with pytest.raises(CatalogError, match=r"duplicate question ids urbanvideo:7\b.*") as err:
        urbanvideo.read(_mirror(tmp_path, table), [])
    assert "MCQ.parquet" in str(err.value)


def test_bad_source_files_are_named_in_one_line(tmp_path: Path) -> None:
    from embodied_r.benchmarks import urbanvideo
    from embodied_r.io import safe_extract

    folder = _mirror(tmp_path, pa.table({"Question_id": [1], "video_id": ["v"], "question_category": ["c"],
                                       "question": ["q"], "answer": [[1, 2]]}))
    with pytest.raises(CatalogError, match="column 'answer'"):
        urbanvideo.read(folder, [])
    garbage = next(folder.rglob("*.parquet"))
    garbage.write_bytes(b"PAR1 not really")
    with pytest.raises(CatalogError, match="not a readable Parquet file") as err:
        urbanvideo.read(folder, [])
    assert str(garbage) in str(err.value) and "\n" not in str(err.value)
    fake = tmp_path / "videos.zip"
    fake.write_bytes(b"this is no zip")
    with pytest.raises(DataSourceError, match="videos.zip"):
        safe_extract(fake, tmp_path / "x", 10**9)


# -- one stage, one run; nothing outlives a killed run ----------------------------------

HOLDER = """
import sys, time
from embodied_r.io import stage_folder
with stage_folder(sys.argv[1]) as work:
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_run_on_a_stage_fails_at_once_or_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    final = tmp_path / "stages" / "perception" / "abc"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(final)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("EMBODIED_R_LOCK", "fail")
        with pytest.raises(StageBusy, match="another process"):
            with stage_folder(final):
                pass
        holder.kill()  # kill -9: the kernel drops the lock with the process
        holder.wait()
        monkeypatch.setenv("EMBODIED_R_LOCK", "wait")
        with stage_folder(final) as work:
            (work / "summary.json").write_text("{}")
        assert (final / "summary.json").is_file()
    finally:
        if holder.poll() is None:
            holder.kill()


# The child's pid is printed once the child has armed its watch, so the kill never lands
# before it (a child that is still starting would outlive its parent for another reason).
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "from embodied_r.children import die_with_parent; import time; die_with_parent(); "
    "print('armed', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "armed"
print(child.pid, flush=True)
time.sleep(120)
"""


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, env=env)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 15
    while time.time() < deadline and Path(f"/proc/{child}").exists() and "Z" not in _state(child):
        time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in _state(child)


STARTING = ("import sys, time; print('importing', flush=True); time.sleep(3); "
            "print('imported', flush=True)")


@pytest.mark.parametrize("deaf", [True, False])
def test_a_child_still_importing_survives_the_terminals_ctrl_c(deaf: bool) -> None:
    """The race a Ctrl-C to the process group used to lose: a child started inside
    ``children_deaf_to_ctrl_c`` that is still importing (before any handler of its own) is
    not killed with a traceback; the same child started outside it is."""
    from contextlib import nullcontext

    from embodied_r.children import children_deaf_to_ctrl_c

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    # As a terminal starts a command: a handler here (exec resets it to the default in the
    # child), never an ignore inherited from a shell that ran the tests in the background.
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with children_deaf_to_ctrl_c() if deaf else nullcontext():
            child = subprocess.Popen([sys.executable, "-c", STARTING], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, handler)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before  # the parent's own mask is back
    assert child.stdout.readline().strip() == "importing"
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    if deaf:
        assert (child.returncode, out.strip(), err) == (0, "imported", "")
    else:
        assert child.returncode != 0 and "KeyboardInterrupt" in err


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_runs_of_a_dead_process_are_marked_killed(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from embodied_r.tracking.runs import OWNER_TAG, Tracker, owner_tags

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker.open("faults", uri, root=tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = owner_tags()[OWNER_TAG].split(":")[0]
    orphan = tracker.client.create_run(tracker.experiment_id, tags={OWNER_TAG: f"{host}:{dead.pid}:1"})
    live = tracker.start_parent("live", {}, {})
    Tracker.open("faults", uri, root=tmp_path)
    client = MlflowClient(uri)
    assert client.get_run(orphan.info.run_id).info.status == "KILLED"
    assert client.get_run(live.parent_run_id).info.status == "RUNNING"


def test_evaluation_counts_failed_calls_as_wrong(tmp_path: Path) -> None:
    from embodied_r.evaluation.config import EvaluationConfig
    from embodied_r.evaluation.stage import run_evaluation
    from embodied_r.training.records import run_records
    from embodied_r.training.records_config import RecordsConfig
    from tests.stage_inputs import VIDEO, catalog_row, write_inputs

    rows = [catalog_row(f"urbanvideo:{i}", "test", answer="A") for i in range(6)]
    catalog, perception = write_inputs(tmp_path, rows, {r["uid"]: VIDEO for r in rows})
    run_records(catalog, perception, tmp_path / "records", RecordsConfig())
    calls = {"n": 0}

    def handle(body: dict) -> StubReply:
        calls["n"] += 1
        if calls["n"] % 2 == 0:
            return StubReply(400, {"error": "context too long"})
        return StubReply(payload=completion("m", "<think>x</think><answer>A</answer>"))

    stub = ChatStub(handle)
    backend = BackendConfig(kind="openai", model="m", base_url=stub.base_url, timeout_s=5.0, max_retries=0,
                            concurrency=1)
    try:
        with pytest.raises(TooManyFailures):
            run_evaluation(tmp_path / "records", "m", tmp_path / "e1", EvaluationConfig(backend=backend))
        summary = run_evaluation(tmp_path / "records", "m", tmp_path / "e2",
                                 EvaluationConfig(backend=backend, max_failed_fraction=1.0))
    finally:
        stub.stop()
    assert not (tmp_path / "e1").exists()
    # 3 right of 6 asked: 0.5, not 3 of the 3 that answered.
    assert summary["failed"] == 3 and summary["done"] == 3 and summary["accuracy/overall"] == pytest.approx(0.5)
    assert pq.read_table(tmp_path / "e2" / "predictions.parquet").num_rows == 6
