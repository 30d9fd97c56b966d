"""A Prefect API that stops answering is named in one line within about 30 seconds: Prefect's
client would retry each call with backoff, the run stalled for minutes without a word. Once the
server is gone or silent for ``WAIT_S``, the run ends as an interrupt does, with exit status 1."""

from __future__ import annotations

import threading
import time
from typing import Any

from embodied_r import progress

POLL_S = 5.0
# A server that answers nothing for this long is taken as gone (checks start POLL_S apart, so
# the line comes within WAIT_S + POLL_S of the last answer).
WAIT_S = 25.0

# The ephemeral server processes that have answered once. Prefect marks its server running
# before the server answers, and waits up to PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
# (300 s, cli._setup_env) for a start that migrates a fresh database on a busy machine: until
# the first answer the silence is that start, Prefect's to judge, not a server gone.
_up: set[int] = set()


def _ephemeral() -> Any | None:
    try:
        from prefect.server.api.server import SubprocessASGIServer
    except ImportError:
        return None
    for server in list(SubprocessASGIServer._instances.values()):
        if getattr(server, "running", False) and getattr(server, "server_process", None) is not None:
            return server
    return None


def _configured_url() -> str | None:
    try:
        from prefect.settings import PREFECT_API_URL

        return PREFECT_API_URL.value() or None
    except Exception:  # noqa: BLE001 - no setting, nothing to watch
        return None


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=POLL_S).status_code < 500
    except httpx.HTTPError:
        return False


def problem(since: float | None) -> tuple[str | None, float | None]:
    """(what is wrong with the run's Prefect API, to say now, or None; since when it is silent)."""
    server = _ephemeral()
    if server is not None:
        process = server.server_process
        if process is None:
            return None, None
        code = process.poll()
        # Prefect's own stop (at exit) also ends the process: only a server still marked
        # running, with the same process, has died under the run. Exit code 3 before the first
        # answer is a port taken meanwhile: Prefect starts another on a free one.
        if code is not None and server.running and server.server_process is process \
                and (code != 3 or process.pid in _up):
            return f"Prefect's API server ({server.api_url}) exited with code {code}", since
        url = server.api_url
        if _answers(url):
            _up.add(process.pid)
            return None, None
        if process.pid not in _up:
            return None, None
    else:
        url = _configured_url()
        if not url or _answers(url):
            return None, None
    since = since if since is not None else time.monotonic()
    if time.monotonic() - since >= WAIT_S:
        return f"Prefect's API at {url} has not answered for {WAIT_S + POLL_S:.0f} s", since
    return None, since


def line(why: str) -> str:
    where = progress.where(timeout=0.5)
    during = f" during {where[0]}" if where else ""
    return f"stopped{during}: {why}; the finished work is kept: rerun to resume"


def _watch() -> None:
    from embodied_r.apps.interrupt import end

    since = None
    main = threading.main_thread()
    while True:
        time.sleep(POLL_S)
        if not main.is_alive():
            return  # the process is exiting: Prefect stops its server on purpose
        why, since = problem(since)
        if why is not None and main.is_alive():
            end(lambda: line(why), f"stopped: {why}; rerun to resume", 1)


def start_watch() -> None:
    threading.Thread(target=_watch, name="prefect-watch", daemon=True).start()
