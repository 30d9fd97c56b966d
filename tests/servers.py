"""Start real servers on 127.0.0.1 for end-to-end tests, and stop them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from embodied_r.backends.base import BackendConfig

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A port free a moment ago, where nobody listens (a refused connection). Another process
    may take it before a server binds it: start servers with ``serve_on_free_port``, which
    tries another port when that happens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ok(cmd: list[str], env: dict[str, str], timeout: float = 300, cwd: Path = ROOT) -> str:
    """Run ``cmd`` to its end, from the checkout; it must exit 0. Its stdout and stderr together."""
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


@contextmanager
def serve_on_free_port(cmd_for: Callable[[int], list[str]], log: Path, env: dict[str, str],
                       ready_path: str = "/health", timeout: float = 120, cwd: Path | None = None,
                       tries: int = 3) -> Iterator[tuple[subprocess.Popen, int]]:
    """``background(cmd_for(port))`` on a free port, ready when ``ready_path`` answers 200.
    A server that exits before it is ready because its port was taken meanwhile (the race
    between ``free_port`` closing the port and the server binding it) is started again on
    another port; any other failure is raised at once."""
    for attempt in range(tries):
        port = free_port()
        try:
            with background(cmd_for(port), log, env, cwd=cwd,
                            ready_url=f"http://127.0.0.1:{port}{ready_path}", timeout=timeout) as proc:
                yield proc, port
                return
        except RuntimeError:
            taken = log.exists() and "address already in use" in log.read_text(errors="replace").lower()
            if not taken or attempt == tries - 1:
                raise


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"server for {url} exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@contextmanager
def background(cmd: list[str], log: Path, env: dict[str, str], cwd: Path | None = None,
               ready_url: str | None = None, timeout: float = 120,
               as_from_a_script: bool = False) -> Iterator[subprocess.Popen]:
    """A process in its own group, its output in ``log``; the whole group is stopped after.
    ``as_from_a_script``: started as ``cmd &`` in a shell script starts it, with SIGINT ignored."""
    ignore_sigint = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if as_from_a_script else None
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True, preexec_fn=ignore_sigint)
    try:
        if ready_url:
            wait_http(ready_url, timeout, proc, log)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@dataclass
class StubReply:
    """What a ``ChatStub`` sends back: a JSON payload (or raw text) with a status and
    headers, or a dropped connection, optionally after a delay."""

    status: int = 200
    payload: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False
    delay_s: float = 0.0


def completion(model: str, text: str, prompt_tokens: int = 10, completion_tokens: int | None = None) -> dict:
    """An OpenAI chat-completion body."""
    completion_tokens = len(text.split()) if completion_tokens is None else completion_tokens
    return {
        "id": "x", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class ChatStub:
    """A threaded OpenAI-compatible stub on 127.0.0.1 for faults and scripted answers that
    real servers cannot give on demand. Every POSTed body and its Authorization header are
    recorded; ``handle(body) -> StubReply`` decides the answer."""

    def __init__(self, handle: Callable[[dict[str, Any]], StubReply]):
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str] = []
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.bodies.append(body)
                    stub.auth.append(self.headers.get("Authorization", ""))
                reply = handle(body)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                payload = reply.payload
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(reply.status)
                for key, value in {"Content-Type": "application/json", **reply.headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ScriptedReference(ChatStub):
    """A consistency reference that answers what the reasoning says after ``REF=``: a
    letter or number, ``FAIL`` for a refused call (HTTP 400, never retried), or, with no
    ``REF=`` at all, ``default``."""

    def __init__(self, default: str = "?"):
        self.default = default
        super().__init__(self._reply)

    def _reply(self, body: dict[str, Any]) -> StubReply:
        import re

        found = re.search(r"REF=([\w.]+)", body["messages"][-1]["content"])
        said = found.group(1) if found else self.default
        if said == "FAIL":
            return StubReply(status=400, payload={"error": {"message": "the reference refused this one"}})
        return StubReply(payload=completion(body["model"], said))

    def backend(self) -> Any:
        from embodied_r.backends.base import BackendConfig

        return BackendConfig(kind="openai", model="reference", base_url=self.base_url, max_retries=0,
                             timeout_s=120.0, api_key_env="EMBODIED_R_TEST_KEY")


Reply = Callable[[str, list[dict[str, Any]]], str]


class ScriptedModels(ChatStub):
    """An OpenAI-compatible chat server on 127.0.0.1 whose models answer by a script,
    ``reply(model, messages) -> text``: a stand-in for models that write well-formed
    answers, which the random-weight tiny models never do."""

    def __init__(self, reply: Reply):
        super().__init__(lambda body: StubReply(
            payload=completion(body["model"], reply(body["model"], body["messages"]))))
        self.requests = self.bodies

    def backend(self, model: str, **kw: Any) -> BackendConfig:
        from embodied_r.backends.base import BackendConfig

        return BackendConfig(kind="openai", model=model, base_url=self.base_url, max_retries=0, timeout_s=10.0,
                             api_key_env="EMBODIED_R_TEST_KEY", **kw)

def text_of(messages: list[dict[str, Any]]) -> str:
    parts = []
    for m in messages:
        content = m["content"]
        parts += [content] if isinstance(content, str) else [p.get("text", "") for p in content]
    return "\n".join(parts)
