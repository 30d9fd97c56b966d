"""The wire side of the ``openai`` backend: its exceptions, error bodies, the structured
output field and how servers refuse it, ``Retry-After``, and the private event loop that
keeps ``generate`` synchronous."""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import json
import threading
import time
from typing import Any, Coroutine, Mapping, TypeVar

T = TypeVar("T")

MAX_RETRY_AFTER_S = 120.0


class HTTPStatusError(Exception):
    def __init__(self, status: int, message: str, headers: Mapping[str, str]):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.headers = headers


class MalformedReply(Exception):
    """A 2xx reply that is not a chat completion."""


class EmptyReply(Exception):
    """A chat completion without text (``content`` empty or null): no result."""


def error_message(raw: bytes) -> str:
    try:
        data = json.loads(raw)
    except ValueError:
        return raw[:500].decode("utf-8", "replace")
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        error = error.get("message") or error.get("detail") or error
    return str(error)[:500]


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    # The title becomes the schema's name; strict modes accept only the schema proper.
    body = {k: v for k, v in schema.items() if k != "title"}
    return {
        "type": "json_schema",
        "json_schema": {"name": str(schema.get("title") or "reply"), "schema": body, "strict": True},
    }


# Words by which servers name the structured-output field they refuse.
_STRUCTURED_WORDS = ("response_format", "json_schema", "structured output", "guided")


def refuses_structured_output(status: int, message: str) -> bool:
    return status in (400, 422, 501) and any(w in message.lower() for w in _STRUCTURED_WORDS)


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds the server asked us to wait, from ``retry-after-ms`` or ``Retry-After``
    (delta-seconds or an HTTP date); None when absent or unreadable."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, parsed.timestamp() - time.time())


class LoopThread:
    """A private event loop in a daemon thread: ``generate`` stays synchronous and works
    whether or not the caller already runs an event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="openai-backend", daemon=True)
        self.thread.start()

    @property
    def running(self) -> bool:
        return self.thread.is_alive() and self.loop.is_running() and not self.loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """``coro``'s result; a loop that no longer runs (stopped, or frozen at interpreter
        exit) raises instead of leaving the caller waiting for ever."""
        if not self.running:
            coro.close()
            raise RuntimeError("the backend's event loop no longer runs")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the backend's event loop did not answer within {timeout:g} s") from None

    def stop(self, wait_s: float = 10.0) -> None:
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # closed meanwhile
            return
        if wait_s > 0:
            self.thread.join(timeout=wait_s)
        if not self.thread.is_alive():
            self.loop.close()
