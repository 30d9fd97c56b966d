"""Fault script: each case against real local servers (127.0.0.1) and real processes.

    PYTHONPATH=. python benchmarks/faults.py [--kills N] [--seed S] [--skip-kills] [--only TEXT ...] [--work DIR]

Prints a table: case, outcome, verdict. A verdict reads "clear error, nothing lost" (the
run stopped with a message, its work kept, nothing cached as done) or "recovered" (a rerun
finished the job); anything else is a finding. The kill cases (``fault_kills``) run the demo
uninterrupted once, then kill -9 the CLI N times at random moments inside key frames,
perception and training, in fresh homes, three kills a home, rerunning after each, and
compare each home's final outputs (key frames, perception, records, trained weights) with
the uninterrupted run's. Bounded: every subprocess has a deadline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fault_inputs import cli as _cli  # noqa: E402
from benchmarks.fault_kills import CASES, OK_ERROR, RECOVERED, case, kill_cases  # noqa: E402
import benchmarks.fault_disk  # noqa: E402,F401 - registers its cases
import benchmarks.fault_losses  # noqa: E402,F401 - registers its cases
import benchmarks.fault_replies  # noqa: E402,F401 - registers its cases
import benchmarks.fault_sentences  # noqa: E402,F401 - registers its cases
from tests.servers import ChatStub, StubReply, completion, free_port  # noqa: E402



# -- perception against a failing server, then a healthy one -------------------------------

def _perception_outage(tmp: Path, fault: Callable[[dict], StubReply | None] | None, port_closed: bool = False,
                       timeout_s: float = 5.0) -> tuple[str, str]:
    from embodied_r.errors import StageFault
    from embodied_r.perception.stage import run_perception
    from tests.perception.test_perception import make_inputs
    from tests.perception.test_perception_http import RecordingServer, stage_cfg

    catalog, kf = make_inputs(tmp, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    out = tmp / "perception"
    healthy = RecordingServer()
    bad = ChatStub(lambda body: fault(body) or StubReply(payload=completion("vlm", "x"))) if fault else None
    url = f"http://127.0.0.1:{free_port()}/v1" if port_closed else (bad.base_url if bad else healthy.base_url)
    cfg = stage_cfg(healthy, "per_question")
    cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(
        update={"base_url": url, "max_retries": 1, "timeout_s": timeout_s})})
    started = time.monotonic()
    try:
        run_perception(catalog, kf, out, cfg)
        return "finished against a failing server", "FAIL: outage cached as done"
    except StageFault as exc:
        first = f"stopped in {time.monotonic() - started:.1f} s: {str(exc)[:90]}..."
    finally:
        if bad:
            bad.stop()
    if out.exists() or not Path(str(out) + ".partial").is_dir():
        return first, "FAIL: final folder written or partial lost"
    try:
        summary = run_perception(catalog, kf, out, stage_cfg(healthy, "per_question"))
        sent = len(healthy.bodies)
    finally:
        healthy.stop()
    if summary["done"] != 3 or not (out / "summary.json").is_file():
        return first, f"FAIL: rerun {summary['done']}/3"
    return f"{first}; rerun sent {sent} calls, done 3/3", RECOVERED


@case("perception: server port closed")
def _closed(tmp: Path) -> tuple[str, str]:
    return _perception_outage(tmp, None, port_closed=True)


@case("perception: server answers 500")
def _five_hundred(tmp: Path) -> tuple[str, str]:
    return _perception_outage(tmp, lambda body: StubReply(500, {"error": "overloaded"}, {"Retry-After": "0"}))


@case("perception: server answers garbage")
def _garbage(tmp: Path) -> tuple[str, str]:
    return _perception_outage(tmp, lambda body: StubReply(200, "<html>proxy error</html>"))


@case("perception: server hangs (timeout 5 s)")
def _hang(tmp: Path) -> tuple[str, str]:
    return _perception_outage(tmp, lambda body: StubReply(200, completion("vlm", "late"), delay_s=8), timeout_s=5.0)


@case("perception: reply content is a list")
def _list_content(tmp: Path) -> tuple[str, str]:
    body = completion("vlm", "x")
    body["choices"][0]["message"]["content"] = [{"type": "text", "text": "x"}]
    return _perception_outage(tmp, lambda b: StubReply(payload=body))


# -- evaluation: every second call fails ---------------------------------------------------

@case("evaluate: every 2nd call refused (400)")
def _half_failing(tmp: Path) -> tuple[str, str]:
    import pyarrow.parquet as pq

    from embodied_r.backends.base import BackendConfig
    from embodied_r.errors import TooManyFailures
    from embodied_r.evaluation.config import EvaluationConfig
    from embodied_r.evaluation.stage import run_evaluation
    from tests.stage_inputs import VIDEO, catalog_row, write_inputs
    from embodied_r.training.records import run_records
    from embodied_r.training.records_config import RecordsConfig

    rows = [catalog_row(f"urbanvideo:{i}", "test") for i in range(10)]
    catalog, perception = write_inputs(tmp, rows, {r["uid"]: VIDEO for r in rows})
    run_records(catalog, perception, tmp / "records", RecordsConfig())
    n = {"calls": 0}

    def handle(body: dict) -> StubReply:
        n["calls"] += 1
        if n["calls"] % 2 == 0:
            return StubReply(400, {"error": "context too long"})
        return StubReply(payload=completion("m", "<think>x</think><answer>A</answer>"))

    stub = ChatStub(handle)
    backend = BackendConfig(kind="openai", model="m", base_url=stub.base_url, timeout_s=5.0, max_retries=0,
                            concurrency=1)
    try:
        try:
            run_evaluation(tmp / "records", "m", tmp / "eval", EvaluationConfig(backend=backend))
            return "finished", "FAIL: accuracy from a subset"
        except TooManyFailures as exc:
            first = str(exc)[:70] + "..."
        # Allowed by the recipe: every question still counts (failed ones score 0).
        summary = run_evaluation(tmp / "records", "m", tmp / "eval2",
                                 EvaluationConfig(backend=backend, max_failed_fraction=1.0))
    finally:
        stub.stop()
    preds = pq.read_table(tmp / "eval2" / "predictions.parquet").num_rows
    ok = preds == 10 and summary["items"] == 10 and summary["accuracy/overall"] <= 0.5
    return (f"{first}; with max_failed_fraction 1: {summary['failed']} failed, {preds} rows, "
            f"accuracy {summary['accuracy/overall']:.2f} over all 10"), OK_ERROR if ok else "FAIL"


@case("secret echoed in an error body")
def _secret(tmp: Path) -> tuple[str, str]:
    import pyarrow.parquet as pq

    from embodied_r.errors import StageFault
    from embodied_r.perception.stage import run_perception
    from tests.perception.test_perception import make_inputs
    from tests.perception.test_perception_http import stage_cfg, RecordingServer

    os.environ["EMBODIED_R_TEST_NO_KEY"] = "sk-faultscript-0123456789"
    catalog, kf = make_inputs(tmp, {"a": 2}, [("q:1", "a")])
    srv = RecordingServer(fault=lambda body: (400, f"bad request; you sent {srv.auth[-1]}"))
    cfg = stage_cfg(srv, "per_question").model_copy(update={"max_failed_fraction": 1.0})
    try:
        run_perception(catalog, kf, tmp / "out", cfg)
    except StageFault:
        pass
    finally:
        srv.stop()
    stored = "".join(p.read_bytes().decode("latin-1") for p in (tmp / "out").rglob("*") if p.is_file())
    stored += pq.read_table(tmp / "out" / "failures.parquet").to_pandas().to_string()
    leaked = "sk-faultscript-0123456789" in stored
    return ("key absent from failures.parquet and summary" if not leaked else "key stored"), \
        (OK_ERROR if not leaked else "FAIL: secret stored")


# -- recipes and files ---------------------------------------------------------------------

@case("recipes: nonsense values (9 kinds)")
def _recipes(tmp: Path) -> tuple[str, str]:
    sets = ["training.learning_rate=-1", "training.learning_rate=.nan", "training.learning_rate=.inf",
            "perception.backend.temperature=-3", "perception.backend.timeout_s=0",
            "evaluation.backend.max_new_tokens=0", "download.max_zip_bytes=-5", "evaluation.split=holdout",
            "training.learning_rate=[1,2"]
    bad = []
    for s in sets:
        res = _cli(["validate", "--set", s], tmp, timeout=120)
        if res.returncode == 0 or "Traceback" in res.stderr:
            bad.append(s)
    if bad:
        return f"accepted or traceback: {bad}", "FAIL"
    return f"all {len(sets)} refused with a message, no traceback", OK_ERROR


@case("preprocess: duplicate ids, garbage parquet, bad zip")
def _files(tmp: Path) -> tuple[str, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embodied_r.benchmarks import urbanvideo
    from embodied_r.errors import CatalogError, DataSourceError
    from embodied_r.io import safe_extract

    folder = tmp / urbanvideo.BENCHMARK.folder
    folder.mkdir(parents=True)
    row = {"video_id": "v.mp4", "question_category": "Counterfactual", "question": "Q? A. x B. y", "answer": "A"}
    pq.write_table(pa.Table.from_pylist([{"Question_id": 3, **row}, {"Question_id": 3, **row}]),
                   folder / urbanvideo.FILE)
    messages = []
    for prepare in (lambda: None, lambda: (folder / urbanvideo.FILE).write_bytes(b"garbage")):
        prepare()
        try:
            urbanvideo.read(folder, [])
            return "accepted", "FAIL"
        except CatalogError as exc:
            messages.append(str(exc))
    (tmp / "v.zip").write_bytes(b"not a zip")
    try:
        safe_extract(tmp / "v.zip", tmp / "x", 10**9)
        return "zip accepted", "FAIL"
    except DataSourceError as exc:
        messages.append(str(exc))
    named = all(("MCQ.parquet" in m or "v.zip" in m) and "\n" not in m for m in messages)
    return "; ".join(m.split(": ", 1)[-1][:40] for m in messages), OK_ERROR if named else "FAIL: file not named"


@case("training: checkpoint cut short by a kill")
def _checkpoint(tmp: Path) -> tuple[str, str]:
    import torch
    from safetensors.torch import save_file

    from embodied_r.training.checkpoints import last_checkpoint

    for step in (1, 2):
        folder = tmp / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        save_file({"w": torch.zeros(256)}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    cut = tmp / "checkpoints" / "checkpoint-2" / "model.safetensors"
    cut.write_bytes(cut.read_bytes()[:100])
    resume, step = last_checkpoint(tmp)
    return f"resumes from checkpoint-{step}", RECOVERED if step == 1 else "FAIL"


@case("two runs on one stage")
def _lock(tmp: Path) -> tuple[str, str]:
    from embodied_r.errors import StageBusy
    from embodied_r.io import stage_folder

    holder = subprocess.Popen([sys.executable, "-c", "import sys,time\nfrom embodied_r.io import stage_folder\n"
                               "with stage_folder(sys.argv[1]):\n print('held', flush=True); time.sleep(60)",
                               str(tmp / "stage")], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        holder.stdout.readline()
        os.environ["EMBODIED_R_LOCK"] = "fail"
        try:
            with stage_folder(tmp / "stage"):
                return "shared the partial folder", "FAIL"
        except StageBusy as exc:
            msg = str(exc)[:60]
    finally:
        os.environ.pop("EMBODIED_R_LOCK", None)
        holder.kill()
        holder.wait()
    return f"second run refused: {msg}...", OK_ERROR




def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=3, help="kill -9 moments across the demo (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-kills", action="store_true", help="only the server and input cases")
    parser.add_argument("--work", help="keep the work here (default: a temporary folder)")
    parser.add_argument("--only-kills", action="store_true", help="skip the server and input cases")
    parser.add_argument("--only", action="append", default=[],
                        help="run only the cases whose name contains this text (repeatable)")
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    base = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="faults-"))
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    cases = [] if args.only_kills else list(CASES)
    if args.only:
        cases, args.skip_kills = [c for c in cases if any(text in c[0] for text in args.only)], True
    for i, (name, fn) in enumerate(cases):
        tmp = base / f"case{i:02d}"
        tmp.mkdir()
        started = time.monotonic()
        try:
            outcome, verdict = fn(tmp)
        except Exception as exc:  # noqa: BLE001 - a crash is a finding, reported in the table
            outcome, verdict = f"{type(exc).__name__}: {exc}"[:150], "FAIL: crashed"
            traceback.print_exc()
        rows.append((name, f"{outcome} [{time.monotonic() - started:.1f} s]", verdict))
        print(f"{name}: {verdict}", file=sys.stderr, flush=True)
    if not args.skip_kills:
        rows += kill_cases(base / "kills", args.kills, args.seed)
    width = max(len(r[0]) for r in rows)
    print(f"\n| {'case':{width}} | outcome | verdict |\n|{'-' * (width + 2)}|---|---|")
    for name, outcome, verdict in rows:
        print(f"| {name:{width}} | {outcome} | {verdict} |")
    return 0 if all(r[2] in (OK_ERROR, RECOVERED) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
