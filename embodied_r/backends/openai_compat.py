"""The ``openai`` backend: any OpenAI-compatible chat endpoint over HTTP.

Serves ``vllm serve``, hosted APIs and ``transformers serve`` alike. Calls run
concurrently up to ``cfg.concurrency`` per server; each has a total timeout and is retried with
exponential backoff and jitter on rate limits, server errors, timeouts, dropped
connections, malformed and empty replies, honouring ``Retry-After``. A call that still
fails comes back with ``error`` set. The API key is read from the environment, registered
for redaction (``redaction.register_secret``) and never logged or stored.

A server may ignore ``max_tokens``: a reply longer than the budget allows is cut to it
(``Generation.truncated``), so one runaway reply cannot flood the stages after it.

Requests go out through aiohttp rather than the ``openai`` SDK: the SDK spends about
1.6 ms of CPU per call (request transformation, its connection pool's scan of every
open connection) against about 0.2 ms here, and at concurrency 32 on a small machine
that decides whether one event loop keeps every connection busy
(``benchmarks/perception_throughput.py``).

With several servers (``base_urls``) each call goes to the least busy one, and a server
that stops answering is left out while the others carry on (``backends.servers``).

A reply schema, where given, is sent as ``response_format`` (JSON schema, strict). A
server that refuses the field (a 4xx naming it) gets the call again without it, and no
later call asks for it; the caller then reads plain text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
from typing import Any, Callable

from embodied_r.backends.base import GENERATION_CONFIG, BackendConfig, Conversation, Generation, map_image_parts
from embodied_r.backends.images import image_data_url
from embodied_r.backends.openai_wire import (
    MAX_RETRY_AFTER_S,
    EmptyReply,
    HTTPStatusError,
    LoopThread,
    MalformedReply,
    error_message,
    refuses_structured_output,
    response_format,
    retry_after_seconds,
)
from embodied_r.backends.servers import ServerPool, server_fault
from embodied_r.redaction import redact, register_secret

OnResult = Callable[[int, Generation], None]

log = logging.getLogger(__name__)

# Local servers (vLLM, transformers serve) accept any key; hosted ones need the real one.
PLACEHOLDER_KEY = "not-needed"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Refusals that no other input would change: the key, the URL or the model name is wrong.
INFRA_STATUSES = {401, 403, 404, 407}
# No token of a real tokenizer is longer than this many characters: a reply longer than
# ``max_tokens`` times this came from a server that ignored the budget.
MAX_CHARS_PER_TOKEN = 16
# How long closing may wait for the connection pool; it never waits for more.
CLOSE_TIMEOUT_S = 5.0
EMPTY_REPLY = "empty_reply"


def to_openai_messages(conversation: Conversation, max_pixels: int,
                       encoding: str = "jpeg-bilinear") -> list[dict[str, Any]]:
    """Translate ``{"type": "image", "path": ...}`` parts into data URLs."""
    return map_image_parts(conversation, lambda path: {
        "type": "image_url", "image_url": {"url": image_data_url(path, max_pixels, encoding)}})


def has_images(conversation: Conversation) -> bool:
    return any(
        part.get("type") == "image"
        for message in conversation
        if not isinstance(message["content"], str)
        for part in message["content"]
    )


class OpenAIBackend:
    def __init__(self, cfg: BackendConfig, backoff_base_s: float = 1.0, backoff_max_s: float = 60.0):
        import aiohttp

        if problem := cfg.unready():
            raise ValueError(problem)
        self.cfg = cfg
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._aiohttp = aiohttp
        self._pool = ServerPool(cfg.urls() or [DEFAULT_BASE_URL], cfg.concurrency, cfg.max_retries + 1)
        # Held only in this header, which is neither logged nor part of any error text.
        key = os.environ.get(cfg.api_key_env) or PLACEHOLDER_KEY
        self._headers = {"Authorization": f"Bearer {key}"}
        if key != PLACEHOLDER_KEY:
            register_secret(key)
        # (reason, delay in seconds) of every retry, for summaries and tests.
        self.retry_log: list[tuple[str, float]] = []
        # Set once the server has refused response_format; later calls go without it.
        self.structured_output_refused = False
        # The first outage (a call that failed as "infra") in this generate(): its later calls
        # are not sent, since the stage stops anyway and each would spend the retry budget again.
        self.outage: str | None = None
        self._rng = random.Random(cfg.seed)
        self._loop = LoopThread()
        self._session = self._loop.run(self._make_session())

    async def _make_session(self) -> Any:
        # Created on the private loop so its connection pool belongs to that loop.
        aiohttp = self._aiohttp
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.cfg.concurrency * len(self._pool.servers)),
            timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s),
        )

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self._session.post(url, json=body, headers=self._headers) as resp:
            raw = await resp.read()
            if resp.status >= 300:
                raise HTTPStatusError(resp.status, error_message(raw), resp.headers)
        try:
            data = json.loads(raw)
        except ValueError:
            raise MalformedReply(f"reply is not JSON: {raw[:200]!r}") from None
        if not isinstance(data, dict) or not data.get("choices"):
            raise MalformedReply(f"reply without choices: {raw[:200]!r}")
        return data

    def _retry_reason(self, exc: BaseException) -> tuple[str | None, float | None]:
        """(why it is worth retrying, server-requested delay), or (None, None)."""
        if isinstance(exc, asyncio.TimeoutError):
            return "timeout", None
        if isinstance(exc, self._aiohttp.ClientError):
            return "connection", None
        if isinstance(exc, MalformedReply):
            return "malformed", None
        if isinstance(exc, EmptyReply):
            return EMPTY_REPLY, None
        if isinstance(exc, HTTPStatusError):
            if exc.status == 429 or exc.status >= 500 or exc.status == 408:
                return f"http {exc.status}", retry_after_seconds(exc.headers)
        return None, None

    def _backoff(self, attempt: int, requested: float | None) -> float:
        if requested is not None:
            return min(requested, MAX_RETRY_AFTER_S)
        cap = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        # Jitter spreads retries of many concurrent calls apart.
        return cap * (0.5 + 0.5 * self._rng.random())

    async def _call(
        self,
        conversation: Conversation,
        schema: dict[str, Any] | None,
        max_new_tokens: int,
    ) -> Generation:
        try:
            if has_images(conversation):
                # Reading and encoding images is blocking work: off the event loop.
                messages = await asyncio.to_thread(to_openai_messages, conversation, self.cfg.max_pixels,
                                                    self.cfg.image_encoding)
            else:
                messages = to_openai_messages(conversation, self.cfg.max_pixels, self.cfg.image_encoding)
        except Exception as exc:
            return Generation(text="", error=redact(f"prepare: {type(exc).__name__}: {exc}"), error_kind="item")
        kwargs: dict[str, Any] = {
            "model": self.cfg.model,
            "messages": messages,
            "max_tokens": max_new_tokens,
            "temperature": self.cfg.temperature,
            "top_p": self.cfg.top_p,
        }
        if self.cfg.temperature > 0:
            kwargs["seed"] = self.cfg.seed
        # "generation_config" (and unset) leave the field out: the server then uses its own
        # default, which for `vllm serve` is the model's generation_config.json. A number is
        # sent as the extra field that vLLM, SGLang and DashScope accept.
        for name in ("repetition_penalty", "top_k"):
            value = getattr(self.cfg, name)
            if value is not None and value != GENERATION_CONFIG:
                kwargs[name] = value
        attempt = 0
        while True:
            if self.outage is not None:
                return Generation(text="", error=f"not sent: {self.outage}", error_kind="infra")
            server = await self._pool.acquire()
            try:
                # Decided once the call may go: an earlier call may just have found that
                # the server refuses the field.
                if schema is not None and not self.structured_output_refused:
                    kwargs["response_format"] = response_format(schema)
                else:
                    kwargs.pop("response_format", None)
                try:
                    data = await self._post(server.endpoint, kwargs)
                except Exception as exc:
                    failure = exc
                else:
                    try:
                        generation = self._generation(data, max_new_tokens)
                    except Exception as exc:
                        failure = exc  # the server did answer: no server fault, so counted as answered below
                    else:
                        self._pool.answered(server)
                        return generation
                reason, requested = self._retry_reason(failure)
                detail = str(failure) or (
                    f"no reply within {self.cfg.timeout_s:g} s" if reason == "timeout" else "no detail"
                )
                error = redact(f"{type(failure).__name__}: {detail}")
                status = failure.status if isinstance(failure, HTTPStatusError) else None
                refused = (
                    "response_format" in kwargs
                    and isinstance(failure, HTTPStatusError)
                    and refuses_structured_output(failure.status, str(failure))
                )
                fault = server_fault(failure, self._aiohttp, status)
                if fault is None:
                    self._pool.answered(server)
                left_out = fault is not None and self._pool.failed(server, fault, error)
            finally:
                # Released after the reply is read, so the slot bounds calls truly in flight.
                await self._pool.release(server)
            if left_out:
                # The server is out of the rotation and another still answers: the call goes
                # there at once, and this failure is the server's, not the call's.
                self.retry_log.append((f"{reason} at {server.base_url}, sent elsewhere", 0.0))
                continue
            if refused:
                if not self.structured_output_refused:
                    log.warning("the server refuses response_format (%s); reading plain text from now on", error)
                self.structured_output_refused = True
                continue  # at once, and not counted against the retries
            if reason is None:
                if status in INFRA_STATUSES:
                    error = self._pool.outage(server, error)
                    self.outage = self.outage or error
                    return Generation(text="", error=error, error_kind="infra")
                return Generation(text="", error=error, error_kind="item")
            if attempt >= self.cfg.max_retries and reason == EMPTY_REPLY:
                # The same input gets the same empty answer: this item, not the service
                # (a stage whose calls all come back empty fails on its failed share).
                return Generation(text="", error=f"{EMPTY_REPLY}: after {attempt + 1} attempts: {error}",
                                  error_kind="item")
            if attempt >= self.cfg.max_retries:
                # Still down after the whole retry budget: the service, not this item.
                error = self._pool.outage(server, f"after {attempt + 1} attempts: {error}")
                self.outage = self.outage or error
                return Generation(text="", error=error, error_kind="infra")
            delay = self._backoff(attempt, requested)
            self.retry_log.append((reason, delay))
            log.info("retrying in %.2fs after %s (attempt %d)", delay, reason, attempt + 1)
            attempt += 1
            # With the server's slot released (above): a call waiting to retry holds no slot,
            # so fresh calls go out meanwhile.
            await asyncio.sleep(delay)

    @staticmethod
    def _generation(data: dict[str, Any], max_new_tokens: int) -> Generation:
        choice = data["choices"][0]
        message = (choice.get("message") if isinstance(choice, dict) else None) or {}
        content = message.get("content") if isinstance(message, dict) else None
        if content is not None and not isinstance(content, str):
            # Logged as it came, a list or number here would break every resume that replays it.
            raise MalformedReply(f"reply content is a {type(content).__name__}, not text")
        if not (content or "").strip():
            # Taken as a result, an empty text would become an empty perception or a wrong
            # answer, and look like one. Servers that put the text elsewhere (a reasoning
            # parser's reasoning_content) answer so for every call.
            raise EmptyReply(f"the server replied with {'null' if content is None else 'empty'} content "
                             f"(finish_reason {choice.get('finish_reason')!r})")
        usage = data.get("usage") or {}
        limit = max_new_tokens * MAX_CHARS_PER_TOKEN
        completion_tokens = int(usage.get("completion_tokens") or 0)
        truncated = len(content) > limit
        return Generation(
            text=content[:limit],
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=min(completion_tokens, max_new_tokens) if truncated else completion_tokens,
            truncated=truncated,
        )

    async def _generate(
        self,
        conversations: list[Conversation],
        schemas: list[dict[str, Any] | None],
        max_new_tokens: int,
        on_result: OnResult | None,
    ) -> list[Generation]:
        async def one(i: int) -> Generation:
            gen = await self._call(conversations[i], schemas[i], max_new_tokens)
            if on_result is not None:
                # In a worker thread: the callback may write to disk, which must not
                # stall the event loop that drives every other call.
                await asyncio.to_thread(on_result, i, gen)
            return gen

        return list(await asyncio.gather(*(one(i) for i in range(len(conversations)))))

    def generate(
        self,
        conversations: list[Conversation],
        *,
        schemas: list[dict[str, Any] | None] | None = None,
        max_new_tokens: int | None = None,
        on_result: OnResult | None = None,
    ) -> list[Generation]:
        """One generation per conversation, in order. ``schemas``: a reply JSON schema per
        conversation (None for free text); ``max_new_tokens`` overrides the config for
        this batch; ``on_result(index, generation)`` is called as each call finishes."""
        if not conversations:
            return []
        if schemas is not None and len(schemas) != len(conversations):
            raise ValueError(f"{len(schemas)} schemas for {len(conversations)} conversations")
        self.outage = None  # each batch tries the service afresh, every server included
        self._pool.reset()
        return self._loop.run(
            self._generate(
                conversations,
                list(schemas) if schemas is not None else [None] * len(conversations),
                max_new_tokens or self.cfg.max_new_tokens,
                on_result,
            )
        )

    def close(self, wait_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close the connections and end the loop, waiting at most ``wait_s`` seconds for
        each (0: not at all). At interpreter exit the loop's thread is frozen: nothing is
        waited for then."""
        session, self._session = getattr(self, "_session", None), None
        loop = getattr(self, "_loop", None)
        if loop is None:
            return
        if sys.is_finalizing():
            wait_s = 0.0
        try:
            if session is not None and loop.running:
                if wait_s > 0:
                    loop.run(session.close(), timeout=wait_s)
                else:
                    asyncio.run_coroutine_threadsafe(session.close(), loop.loop)
        except (RuntimeError, TimeoutError) as exc:
            log.debug("closing the backend's connections: %s", exc)
        finally:
            loop.stop(wait_s)

    def __del__(self) -> None:
        # A finaliser must never block: it may run at interpreter exit or inside the loop.
        try:
            self.close(wait_s=0.0)
        except Exception:  # noqa: BLE001 - nothing to report to at this point
            pass
