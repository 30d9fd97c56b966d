"""Fault cases of replies that are no result, keys echoed back, exits and fresh homes.

Each case returns (outcome, verdict) for ``benchmarks/faults.py``'s table: an echoed key
(hex, then JWT) searched for in every file of a fresh home and on the console after real CLI
runs; perception whose replies are all empty, or name no action, or run to 200 KB; evaluation
prompts past the training's limit; a backend left open at interpreter exit; three processes
creating one fresh MLflow store together.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.fault_kills import OK_ERROR, RECOVERED, case  # noqa: E402
from tests.servers import ChatStub, StubReply, completion  # noqa: E402

KEY_ENV = "EMBODIED_R_FAULT_ECHOED_KEY"
HEX_KEY = "9c1e5a7b3d2f40e6a8b1c0d9e7f6a5b4"
JWT_KEY = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJmYXVsdC1zdWl0ZSIsIm4iOjF9.ZmFrZS1zaWduYXR1cmUtZm9yLXRoZS1zdWl0ZQ"



def _empty_body(content: str | None) -> dict[str, Any]:
    body = completion("vlm", "x")
    body["choices"][0]["message"]["content"] = content
    return body


def _perception_against(tmp: Path, reply: Callable[[dict], StubReply]) -> tuple[Any, Any, Path, Any, ChatStub]:
    from tests.perception.test_perception import make_inputs
    from tests.perception.test_perception_http import stage_cfg

    catalog, kf = make_inputs(tmp, {"a": 3, "b": 2}, [("q:1", "a"), ("q:2", "a"), ("q:3", "b")])
    stub = ChatStub(reply)
    cfg = stage_cfg(stub, "per_question")
    cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(update={"max_retries": 1})})
    return catalog, kf, tmp / "perception", cfg, stub


def _fails_then_recovers(tmp: Path, reply: Callable[[dict], StubReply], refresh: bool) -> tuple[str, str]:
    """A bad server stops the stage with a one-line message naming it; a healthy one then
    finishes it (after discarding the bad replies, as ``--refresh perception`` does)."""
    from embodied_r.errors import StageFault
    from embodied_r.perception.stage import run_perception
    from flows.runner import discard
    from tests.perception.test_perception_http import RecordingServer

    catalog, kf, out, cfg, bad = _perception_against(tmp, reply)
    try:
        run_perception(catalog, kf, out, cfg)
        return "finished on replies that are no perception", "FAIL: taken as a result"
    except StageFault as exc:
        message = str(exc)
    finally:
        bad.stop()
    if bad.base_url not in message or "\n" in message or out.exists():
        return message[:150], "FAIL: server not named, or not one line, or cached"
    if refresh:
        discard(out)
    healthy = RecordingServer()
    try:
        summary = run_perception(catalog, kf, out, cfg.model_copy(
            update={"backend": cfg.backend.model_copy(update={"base_url": healthy.base_url})}))
    finally:
        healthy.stop()
    first = message.split(": ", 1)[-1][:80]
    if summary["done"] != 3:
        return first, f"FAIL: rerun {summary['done']}/3"
    return f"{first}...; rerun on a healthy server: 3/3", RECOVERED


@case("perception: every reply empty (content null)")
def _empty(tmp: Path) -> tuple[str, str]:
    return _fails_then_recovers(tmp, lambda body: StubReply(payload=_empty_body(None)), refresh=False)


@case("perception: replies name no action")
def _no_action(tmp: Path) -> tuple[str, str]:
    return _fails_then_recovers(tmp, lambda body: StubReply(payload=completion("vlm", "Hello! How can I help?")),
                                refresh=True)


@case("perception: 220 KB replies (max_tokens ignored)")
def _flood(tmp: Path) -> tuple[str, str]:
    from embodied_r.perception.stage import run_perception
    from tests.perception.test_perception_http import reply_for

    flood = " and more" * 25_000
    catalog, kf, out, cfg, stub = _perception_against(
        tmp, lambda body: StubReply(payload=completion("vlm", reply_for(body) + flood)))
    try:
        summary = run_perception(catalog, kf, out, cfg)
    finally:
        stub.stop()
    biggest = max(p.stat().st_size for p in out.rglob("*") if p.is_file())
    ok = summary["replies_truncated"] == summary["calls"] and biggest < 200_000
    return (f"done {summary['done']}/3, replies_truncated {summary['replies_truncated']} of {summary['calls']}, "
            f"largest file {biggest // 1024} KB"), RECOVERED if ok else "FAIL"


@case("evaluate: prompts past training's max_prompt_length")
def _long_prompts(tmp: Path) -> tuple[str, str]:
    from embodied_r.backends.base import BackendConfig
    from embodied_r.demo.tiny_models import ensure_tiny_lm
    from embodied_r.evaluation.config import EvaluationConfig
    from embodied_r.evaluation.stage import run_evaluation
    from embodied_r.training.records import run_records
    from embodied_r.training.records_config import RecordsConfig
    from tests.stage_inputs import VIDEO, catalog_row, write_inputs

    rows = [catalog_row(f"urbanvideo:{i}", "test") for i in range(4)]
    texts = {r["uid"]: VIDEO + " a red door ahead." * (4000 if i % 2 else 0) for i, r in enumerate(rows)}
    catalog, perception = write_inputs(tmp, rows, texts)
    run_records(catalog, perception, tmp / "records", RecordsConfig())
    model = ensure_tiny_lm(tmp / "models")
    cfg = EvaluationConfig(backend=BackendConfig(kind="transformers", device="cpu"), max_new_tokens=4,
                           max_prompt_length=1024)
    started = time.monotonic()
    summary = run_evaluation(tmp / "records", str(model), tmp / "eval", cfg)
    ok = summary["prompts_truncated"] == 2 and summary["done"] == 4
    return (f"prompts of ~20k tokens cut to 1024: prompts_truncated {summary['prompts_truncated']} of 4, "
            f"done in {time.monotonic() - started:.1f} s"), RECOVERED if ok else "FAIL"


def _cli_run(home: Path, url: str, key: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_R_HOME": str(home), KEY_ENV: key,
           "PREFECT_HOME": str(home / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    sets = {"perception.backend.kind": "openai", "perception.backend.base_url": url,
            "perception.backend.model": "vlm", "perception.backend.api_key_env": KEY_ENV,
            "perception.backend.max_retries": "0"}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return subprocess.run([sys.executable, "-m", "embodied_r.apps.cli", "run", "--recipe", "smoke", *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=home)


@case("key (hex, JWT) echoed in 400 and 401 bodies")
def _echoed_key(tmp: Path) -> tuple[str, str]:
    home = tmp / "home"
    home.mkdir()
    status = {"code": 400}

    def handle(body: dict) -> StubReply:
        sent = stub.auth[-1].removeprefix("Bearer ")
        return StubReply(status["code"], {"error": {"message": f"Incorrect API key provided: {sent}."}})

    stub = ChatStub(handle)
    console = ""
    try:
        for key, code in ((HEX_KEY, 400), (HEX_KEY, 401), (JWT_KEY, 400), (JWT_KEY, 401)):
            status["code"] = code
            res = _cli_run(home, stub.base_url, key)
            console += res.stdout + res.stderr
            if res.returncode == 0:
                return f"run with a refused key ({code}) ended rc 0", "FAIL"
    finally:
        stub.stop()
    from tests.faults.test_fault_secrets import stored_text

    files = [p for p in home.rglob("*") if p.is_file()]
    hits = sorted({str(p.relative_to(home)) for p in files for k in (HEX_KEY, JWT_KEY) if k in stored_text(p)})
    printed = [k[:6] for k in (HEX_KEY, JWT_KEY) if k in console]
    outcome = (f"4 CLI runs; {len(files)} files searched (mlflow.db, prefect.db, failures.parquet among them): "
               f"key in {hits or 'none'}, on the console: {printed or 'no'}")
    return outcome, OK_ERROR if not hits and not printed else "FAIL: secret stored or printed"


@case("backend left open at interpreter exit")
def _exit(tmp: Path) -> tuple[str, str]:
    code = ("from embodied_r.backends.base import BackendConfig\n"
            "from embodied_r.backends.openai_compat import OpenAIBackend\n"
            "backend = OpenAIBackend(BackendConfig(kind='openai', model='m', base_url='http://127.0.0.1:9/v1'))\n")
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=30,
                       capture_output=True)
    except subprocess.TimeoutExpired:
        return "still running 30 s after its last line", "FAIL: hangs at exit"
    return f"exited in {time.monotonic() - started:.1f} s", RECOVERED


@case("three runs open a fresh home's MLflow store at once")
def _store_race(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_exit import OPEN_STORE

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    failed = 0
    for attempt in range(5):
        home, go = tmp / f"home{attempt}", tmp / f"go{attempt}"
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_STORE, str(home), str(go)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(3)]
        time.sleep(8)
        go.touch()
        outs = [p.communicate(timeout=180) for p in procs]
        if any(p.returncode for p in procs) or len({o.strip() for o, _ in outs}) != 1:
            failed += 1
    return f"{5 - failed} of 5 tries: all three on one store and experiment", RECOVERED if not failed else "FAIL"
