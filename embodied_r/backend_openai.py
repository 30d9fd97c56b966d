"""The ``openai`` backend: any OpenAI-compatible chat endpoint over HTTP.

Serves ``vllm serve``, hosted APIs and ``transformers serve`` alike. Calls run
concurrently up to ``cfg.concurrency``; each has a total timeout and is retried with
exponential backoff and jitter on rate limits, server errors, timeouts and dropped
connections, honouring ``Retry-After``. A call that still fails comes back with
``error`` set. The API key is read from the environment and never logged or stored.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import io
import logging
import os
import random
import threading
import time
from typing import Any, Coroutine, TypeVar

from embodied_r.backends import BackendConfig, Conversation, Generation

log = logging.getLogger(__name__)
T = TypeVar("T")

# Local servers (vLLM, transformers serve) accept any key; the client insists on one.
PLACEHOLDER_KEY = "not-needed"
MAX_RETRY_AFTER_S = 120.0


def image_data_url(path: str, max_pixels: int) -> str:
    from embodied_r.backend_transformers import load_image

    img = load_image(path, max_pixels)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def to_openai_messages(conversation: Conversation, max_pixels: int) -> list[dict[str, Any]]:
    """Translate ``{"type": "image", "path": ...}`` parts into JPEG data URLs."""
    messages = []
    for message in conversation:
        content = message["content"]
        if isinstance(content, str):
            messages.append(dict(message))
            continue
        parts = []
        for part in content:
            if part.get("type") == "image":
                url = image_data_url(part["path"], max_pixels)
                parts.append({"type": "image_url", "image_url": {"url": url}})
            else:
                parts.append(part)
        messages.append({**message, "content": parts})
    return messages


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


class _LoopThread:
    """A private event loop in a daemon thread: ``generate`` stays synchronous and works
    whether or not the caller already runs an event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="openai-backend", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class OpenAIBackend:
    def __init__(self, cfg: BackendConfig, backoff_base_s: float = 1.0, backoff_max_s: float = 60.0):
        import openai

        if not cfg.base_url and not os.environ.get(cfg.api_key_env):
            raise ValueError(
                f"backend 'openai' needs `base_url` (e.g. http://127.0.0.1:8000/v1) or the API key "
                f"in the environment variable {cfg.api_key_env}"
            )
        if not cfg.model:
            raise ValueError("backend 'openai' needs `model`: the name the server serves the model under")
        self.cfg = cfg
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._openai = openai
        # (reason, delay in seconds) of every retry, for summaries and tests.
        self.retry_log: list[tuple[str, float]] = []
        self._rng = random.Random(cfg.seed)
        self._loop = _LoopThread()
        self._client = self._loop.run(self._make_client())

    async def _make_client(self) -> Any:
        # Created on the private loop so its connection pool belongs to that loop.
        return self._openai.AsyncOpenAI(
            base_url=self.cfg.base_url,
            api_key=os.environ.get(self.cfg.api_key_env) or PLACEHOLDER_KEY,
            max_retries=0,  # retries are ours, so they honour our budget and log
            timeout=self.cfg.timeout_s,
        )

    def _retry_reason(self, exc: BaseException) -> tuple[str | None, float | None]:
        """(why it is worth retrying, server-requested delay), or (None, None)."""
        openai = self._openai
        if isinstance(exc, (asyncio.TimeoutError, openai.APITimeoutError)):
            return "timeout", None
        if isinstance(exc, openai.APIConnectionError):
            return "connection", None
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status == 429 or status >= 500 or status == 408:
                return f"http {status}", retry_after_seconds(exc.response.headers)
        return None, None

    def _backoff(self, attempt: int, requested: float | None) -> float:
        if requested is not None:
            return min(requested, MAX_RETRY_AFTER_S)
        cap = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        # Jitter spreads retries of many concurrent calls apart.
        return cap * (0.5 + 0.5 * self._rng.random())

    async def _call(self, conversation: Conversation, sem: asyncio.Semaphore) -> Generation:
        try:
            messages = await asyncio.to_thread(to_openai_messages, conversation, self.cfg.max_pixels)
        except Exception as exc:
            return Generation(text="", error=f"prepare: {type(exc).__name__}: {exc}")
        kwargs: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": messages,
            "max_tokens": self.cfg.max_new_tokens,
            "temperature": self.cfg.temperature,
            "top_p": self.cfg.top_p,
        }
        if self.cfg.temperature > 0:
            kwargs["seed"] = self.cfg.seed
        attempt = 0
        while True:
            async with sem:
                try:
                    resp = await asyncio.wait_for(
                        self._client.chat.completions.create(**kwargs), timeout=self.cfg.timeout_s
                    )
                    return self._generation(resp)
                except Exception as exc:
                    reason, requested = self._retry_reason(exc)
                    error = f"{type(exc).__name__}: {getattr(exc, 'message', None) or exc}"
            if reason is None:
                return Generation(text="", error=error)
            if attempt >= self.cfg.max_retries:
                return Generation(text="", error=f"after {attempt + 1} attempts: {error}")
            delay = self._backoff(attempt, requested)
            self.retry_log.append((reason, delay))
            log.info("retrying in %.2fs after %s (attempt %d)", delay, reason, attempt + 1)
            attempt += 1
            # Sleep outside the semaphore so waiting calls do not block fresh ones.
            await asyncio.sleep(delay)

    @staticmethod
    def _generation(resp: Any) -> Generation:
        if not resp.choices:
            return Generation(text="", error="response without choices")
        text = resp.choices[0].message.content or ""
        usage = resp.usage
        return Generation(
            text=text,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        )

    async def _generate(self, conversations: list[Conversation]) -> list[Generation]:
        sem = asyncio.Semaphore(self.cfg.concurrency)
        return list(await asyncio.gather(*(self._call(c, sem) for c in conversations)))

    def generate(self, conversations: list[Conversation]) -> list[Generation]:
        if not conversations:
            return []
        return self._loop.run(self._generate(conversations))

    def close(self) -> None:
        if self._client is not None:
            try:
                self._loop.run(self._client.close())
            finally:
                self._client = None
                self._loop.stop()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass
