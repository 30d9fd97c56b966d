"""An API key the server echoes back is never stored or printed, whatever its form.

Hosted APIs answer a refused key with "Incorrect API key provided: <the key>". A fake
OpenAI-compatible server on 127.0.0.1 does the same (400, then 401), the real CLI runs the
pipeline against it in a fresh home, and then every file of the home (stage folders, the
MLflow store and its artifacts, Prefect's database) and the console are searched for the key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from embodied_r.backends.base import BackendConfig
from embodied_r.redaction import redact
from tests.servers import ChatStub, StubReply

ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "EMBODIED_R_TEST_ECHOED_KEY"
HEX_KEY = "3f9a0c6e1b7d42a8e5c0f1d2b3a49687"
JWT_KEY = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJlbWJvZGllZC1yIiwiaWF0IjoxNzAwMDAwMDAwfQ"
           ".c2lnbmF0dXJlLW5vdC1yZWFsLWF0LWFsbA")


@pytest.mark.parametrize("key", [HEX_KEY, JWT_KEY], ids=["hex", "jwt"])
def test_a_known_key_is_redacted_in_any_text(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, key)
    BackendConfig(kind="openai", model="m", api_key_env=KEY_ENV)  # a recipe naming the variable
    for text in (f"Incorrect API key provided: {key}", f"url?k={key}&x=1", f'{{"detail": "{key}"}}'):
        out = redact(text)
        assert key not in out and "[REDACTED]" in out, out


def _echo_server(status: dict[str, int]) -> ChatStub:
    def handle(body: dict) -> StubReply:
        sent = stub.auth[-1].removeprefix("Bearer ")
        return StubReply(status["code"], {"error": {"message": f"Incorrect API key provided: {sent}. You can "
                                                               "find your API key at the provider's site.",
                                                    "type": "invalid_request_error"}})

    stub = ChatStub(handle)
    return stub


def _run(home: Path, url: str, key: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_R_HOME": str(home), KEY_ENV: key,
           "PREFECT_HOME": str(home / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    sets = {"perception.backend.kind": "openai", "perception.backend.base_url": url,
            "perception.backend.model": "vlm", "perception.backend.api_key_env": KEY_ENV,
            "perception.backend.max_retries": "0", "perception.backend.timeout_s": "30"}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return subprocess.run([sys.executable, "-m", "embodied_r.apps.cli", "run", "--recipe", "smoke", *args],
                          capture_output=True, text=True, env=env, timeout=420, cwd=home)


def stored_text(path: Path) -> str:
    """A file's bytes as text, and for compressed or paged formats their decoded values too
    (a Parquet page may be compressed, a long SQLite value split over pages)."""
    text = path.read_bytes().decode("latin-1")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        text += str(pq.read_table(path).to_pylist())
    elif path.suffix == ".db":
        import sqlite3

        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            text += "\n".join(db.iterdump())
    return text


def test_an_echoed_key_is_in_no_file_of_the_home_and_not_on_the_console(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    status = {"code": 400}
    stub = _echo_server(status)
    console = []
    try:
        # A refused request (an item's failure) and a refused key (an outage), one key form each:
        # each run is a whole CLI process; the unit test above crosses every form with every text.
        for key, code in ((HEX_KEY, 400), (JWT_KEY, 401)):
            status["code"] = code
            res = _run(home, stub.base_url, key)
            assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]
            console.append(res.stdout + res.stderr)
    finally:
        stub.stop()
    text = "\n".join(console)
    stored = [p for p in home.rglob("*") if p.is_file()]
    for key in (HEX_KEY, JWT_KEY):
        hits = [str(p.relative_to(home)) for p in stored if key in stored_text(p)]
        assert not hits, f"key found in {hits}"
        assert key not in text, "key printed on the console"
    # The key did travel: the server echoed it, and the error that names it was shown redacted.
    assert "Incorrect API key provided: [REDACTED]" in text, text[-3000:]
    names = {p.name for p in stored}
    assert {"mlflow.db", "prefect.db", "failures.parquet"} <= names, sorted(names)[:50]
