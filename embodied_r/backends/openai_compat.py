"""The ``openai`` backend: any OpenAI-compatible chat endpoint (``vllm serve``, hosted APIs,
``transformers serve``) through the ``openai`` package, over the servers of ``backends.servers``.
Its own are the retries, the structured-output fallback, reply caps, redaction of secrets and
telling an outage ("infra") from a bad item."""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import json
import logging
import os
import random
import sys
import threading
import time
from typing import Any, Callable, Coroutine, Mapping, NamedTuple

import aiohttp
import httpx2
import openai

from embodied_r.backends.base import GENERATION_CONFIG, BackendConfig, Conversation, Generation, map_image_parts
from embodied_r.backends.images import image_data_url
from embodied_r.backends.servers import FAULT, UNREACHABLE, Server, ServerPool
from embodied_r.redaction import redact, register_secret

OnResult = Callable[[int, Generation], None]

log = logging.getLogger(__name__)
# The HTTP layer logs every request at INFO: a line per call in a trainer's log.
logging.getLogger("httpx2").setLevel(logging.WARNING)

# Local servers (vLLM, transformers serve) accept any key; hosted ones need the real one.
PLACEHOLDER_KEY = "not-needed"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Refusals that no other input would change: the key, the URL or the model name is wrong.
INFRA_STATUSES = {401, 403, 404, 407}
RETRIED_STATUSES = {408, 429}  # and every 5xx
# No real token is longer: a reply over ``max_tokens`` times this ignored the budget.
MAX_CHARS_PER_TOKEN = 16
MAX_RETRY_AFTER_S = 120.0
CLOSE_TIMEOUT_S = 5.0
EMPTY_REPLY = "empty_reply"
# Words by which servers name the structured-output field they refuse.
_STRUCTURED_WORDS = ("response_format", "json_schema", "structured output", "guided")


class BadReply(Exception):
    """A 2xx reply that is no result: not a chat completion ("malformed"), or one without
    text (``EMPTY_REPLY``)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Failed(NamedTuple):
    error: str
    reason: str | None  # why a retry may help; None: none would
    status: int | None
    requested: float | None  # the delay the server asked for
    server: Server
    left_out: bool  # the server is out of the rotation now: another takes the call at once
    refused: bool  # the server refuses response_format


def to_openai_messages(conversation: Conversation, max_pixels: int,
                       encoding: str = "jpeg-bilinear") -> list[dict[str, Any]]:
    return map_image_parts(conversation, lambda path: {
        "type": "image_url", "image_url": {"url": image_data_url(path, max_pixels, encoding)}})


def has_images(conversation: Conversation) -> bool:
    return any(part.get("type") == "image" for message in conversation
               if not isinstance(message["content"], str) for part in message["content"])


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    # The title becomes the schema's name; strict modes accept only the schema proper.
    body = {k: v for k, v in schema.items() if k != "title"}
    return {"type": "json_schema",
            "json_schema": {"name": str(schema.get("title") or "reply"), "schema": body, "strict": True}}


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """From ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date); None if unreadable."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            return max(0.0, float((headers or {}).get(name)) / scale)
        except (TypeError, ValueError):
            pass
    try:
        return max(0.0, email.utils.parsedate_to_datetime(headers.get("retry-after")).timestamp() - time.time())
    except (AttributeError, TypeError, ValueError):
        return None


def _causes(exc: BaseException | None) -> list[BaseException]:
    found = []
    while exc is not None:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


def _failure(exc: Exception, timeout_s: float) -> tuple[str, str | None, str | None, float | None]:
    """(the error, why a retry may help or None, whose fault if the server's, the delay it
    asked for) for an exception of one call."""
    if isinstance(exc, openai.APIConnectionError):
        # Told apart by their causes: the package's aiohttp transport raises a connection
        # refused or dropped as APITimeoutError too, where no time ran out.
        causes = _causes(exc)
        if any(isinstance(c, TimeoutError) for c in causes):
            return f"{type(exc).__name__}: no reply within {timeout_s:g} s", "timeout", FAULT, None
        wire = next((c for c in causes if isinstance(c, aiohttp.ClientError)), exc)
        unreached = isinstance(wire, aiohttp.ClientConnectorError)  # refused, unknown host
        return f"{type(wire).__name__}: {wire}", "connection", UNREACHABLE if unreached else FAULT, None
    if isinstance(exc, openai.APIStatusError):
        status, body = exc.status_code, exc.body
        if isinstance(body, dict):
            body = body.get("message") or body.get("detail") or body
        error = f"{type(exc).__name__}: HTTP {status}: {'' if body is None else str(body)[:500]}"
        if status in RETRIED_STATUSES or status >= 500:
            return error, f"http {status}", FAULT if status >= 500 else None, retry_after_seconds(exc.response.headers)
        return error, None, None, None
    reason = exc.reason if isinstance(exc, BadReply) else None
    return f"{type(exc).__name__}: {str(exc) or 'no detail'}", reason, None, None


def refuses_structured_output(status: int | None, message: str) -> bool:
    return status in (400, 422, 501) and any(w in message.lower() for w in _STRUCTURED_WORDS)


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

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """A loop that no longer runs (frozen at interpreter exit) raises, never waits for ever."""
        if not self.running:
            coro.close()
            raise RuntimeError("the backend's event loop no longer runs")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the backend's event loop did not answer within {timeout:g} s") from None

    def stop(self, wait_s: float) -> None:
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


class OpenAIBackend:
    def __init__(self, cfg: BackendConfig, backoff_base_s: float = 1.0, backoff_max_s: float = 60.0):
        if problem := cfg.unready():
            raise ValueError(problem)
        self.cfg = cfg
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._pool = ServerPool(cfg.urls() or [DEFAULT_BASE_URL], cfg.concurrency, cfg.max_retries + 1)
        # Held only by the client, which neither logs it nor puts it in any error text.
        key = os.environ.get(cfg.api_key_env) or PLACEHOLDER_KEY
        if key != PLACEHOLDER_KEY:
            register_secret(key)
        # No proxy from the environment: a cluster's HTTP_PROXY would take the calls meant for
        # 127.0.0.1. No retries of the package's: they would go to the same server.
        connections = cfg.concurrency * len(self._pool.servers)
        limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
        # The aiohttp transport: about half the CPU per call of the default one.
        http = openai.DefaultAioHttpClient(limits=limits, trust_env=False)
        self._client: openai.AsyncOpenAI | None = openai.AsyncOpenAI(
            api_key=key, base_url=self._pool.servers[0].base_url, max_retries=0, timeout=cfg.timeout_s,
            http_client=http)
        self.retry_log: list[tuple[str, float]] = []
        self.structured_output_refused = False
        # The first outage of this generate(): later calls are not sent, as the stage stops anyway.
        self.outage: str | None = None
        self._rng = random.Random(cfg.seed)
        self._loop = LoopThread()

    def _request(self, messages: list[dict[str, Any]], max_new_tokens: int) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.cfg.model, "messages": messages, "max_tokens": max_new_tokens,
                                   "temperature": self.cfg.temperature, "top_p": self.cfg.top_p}
        if self.cfg.temperature > 0:
            request["seed"] = self.cfg.seed
        # "generation_config" (and unset) leave the field out: the server then uses its own
        # default, which for `vllm serve` is the model's generation_config.json. A number is
        # sent as the extra field that vLLM, SGLang and DashScope accept.
        for name in ("repetition_penalty", "top_k"):
            value = getattr(self.cfg, name)
            if value is not None and value != GENERATION_CONFIG:
                request[name] = value
        return request

    async def _send(self, server: Server, request: dict[str, Any], max_new_tokens: int) -> Generation:
        # The body as it is, to the server's own URL, read back raw: the package's typed
        # parameters and reply would double the CPU a call costs (``benchmarks/perception_throughput.py``).
        reply = await self._client.post(f"{server.base_url}/chat/completions", cast_to=httpx2.Response, body=request)
        try:
            data = json.loads(reply.content)
        except ValueError:
            raise BadReply("malformed", f"reply is not JSON: {reply.content[:200]!r}") from None
        if not isinstance(data, dict) or not data.get("choices"):
            raise BadReply("malformed", f"reply without choices: {reply.content[:200]!r}")
        choice = data["choices"][0]
        message = (choice.get("message") if isinstance(choice, dict) else None) or {}
        content = message.get("content") if isinstance(message, dict) else None
        if content is not None and not isinstance(content, str):
            # Logged as it came, a list or number here would break every resume that replays it.
            raise BadReply("malformed", f"reply content is a {type(content).__name__}, not text")
        if not (content or "").strip():
            # Taken as a result, it would look like an empty perception or a wrong answer.
            raise BadReply(EMPTY_REPLY, f"the server replied with {'null' if content is None else 'empty'} "
                                        f"content (finish_reason {choice.get('finish_reason')!r})")
        usage = data.get("usage") or {}
        limit = max_new_tokens * MAX_CHARS_PER_TOKEN
        completion_tokens = int(usage.get("completion_tokens") or 0)
        truncated = len(content) > limit
        return Generation(text=content[:limit], prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=min(completion_tokens, max_new_tokens) if truncated else completion_tokens,
                          truncated=truncated)

    async def _try(self, request: dict[str, Any], schema: dict[str, Any] | None,
                   max_new_tokens: int) -> Generation | Failed:
        server = await self._pool.acquire()
        try:
            # Decided only now: an earlier call may just have found the field refused.
            structured = schema is not None and not self.structured_output_refused
            if structured:
                request["response_format"] = response_format(schema)
            else:
                request.pop("response_format", None)
            try:
                generation = await self._send(server, request, max_new_tokens)
            except Exception as exc:  # noqa: BLE001 - every failure is told apart below
                failure = exc
            else:
                self._pool.answered(server)
                return generation
            error, reason, fault, requested = _failure(failure, self.cfg.timeout_s)
            error = redact(error)
            status = failure.status_code if isinstance(failure, openai.APIStatusError) else None
            if fault is None:
                self._pool.answered(server)
            left_out = fault is not None and self._pool.failed(server, fault, error)
            refused = structured and refuses_structured_output(status, error)
            return Failed(error, reason, status, requested, server, left_out, refused)
        finally:
            # Released after the reply is read, so the slot bounds calls truly in flight.
            await self._pool.release(server)

    async def _call(self, conversation: Conversation, schema: dict[str, Any] | None,
                    max_new_tokens: int) -> Generation:
        try:
            if has_images(conversation):
                # Reading and encoding images is blocking work: off the event loop.
                messages = await asyncio.to_thread(to_openai_messages, conversation, self.cfg.max_pixels,
                                                   self.cfg.image_encoding)
            else:
                messages = to_openai_messages(conversation, self.cfg.max_pixels, self.cfg.image_encoding)
        except Exception as exc:
            return Generation(text="", error=redact(f"prepare: {type(exc).__name__}: {exc}"), error_kind="item")
        request = self._request(messages, max_new_tokens)
        attempt = 0
        while True:
            if self.outage is not None:
                return Generation(text="", error=f"not sent: {self.outage}", error_kind="infra")
            failed = await self._try(request, schema, max_new_tokens)
            if isinstance(failed, Generation):  # it did not fail
                return failed
            error, reason = failed.error, failed.reason
            if failed.left_out:
                # Another server still answers: there at once, the failure the server's.
                self.retry_log.append((f"{reason} at {failed.server.base_url}, sent elsewhere", 0.0))
                continue
            if failed.refused:
                if not self.structured_output_refused:
                    log.warning("the server refuses response_format (%s); reading plain text from now on", error)
                self.structured_output_refused = True
                continue  # at once, and not counted against the retries
            if reason is None and failed.status not in INFRA_STATUSES:
                return Generation(text="", error=error, error_kind="item")
            if attempt >= self.cfg.max_retries and reason == EMPTY_REPLY:
                # The same input gets the same empty answer: this item, not the service.
                return Generation(text="", error=f"{EMPTY_REPLY}: after {attempt + 1} attempts: {error}",
                                  error_kind="item")
            if reason is None or attempt >= self.cfg.max_retries:
                # A refused key, URL or model, or down after every retry: the service.
                error = self._pool.outage(failed.server, error if reason is None else
                                          f"after {attempt + 1} attempts: {error}")
                self.outage = self.outage or error
                return Generation(text="", error=error, error_kind="infra")
            delay = self._backoff(attempt, failed.requested)
            self.retry_log.append((reason, delay))
            log.info("retrying in %.2fs after %s (attempt %d)", delay, reason, attempt + 1)
            attempt += 1
            # Holding no slot, so fresh calls go out meanwhile.
            await asyncio.sleep(delay)

    def _backoff(self, attempt: int, requested: float | None) -> float:
        if requested is not None:
            return min(requested, MAX_RETRY_AFTER_S)
        cap = min(self.backoff_max_s, self.backoff_base_s * 2**attempt)
        # Jitter spreads retries of many concurrent calls apart.
        return cap * (0.5 + 0.5 * self._rng.random())

    def generate(self, conversations: list[Conversation], *, schemas: list[dict[str, Any] | None] | None = None,
                 max_new_tokens: int | None = None, on_result: OnResult | None = None) -> list[Generation]:
        if not conversations:
            return []
        if schemas is not None and len(schemas) != len(conversations):
            raise ValueError(f"{len(schemas)} schemas for {len(conversations)} conversations")
        schemas = schemas or [None] * len(conversations)
        budget = max_new_tokens or self.cfg.max_new_tokens

        async def one(i: int) -> Generation:
            gen = await self._call(conversations[i], schemas[i], budget)
            if on_result is not None:
                # The callback may write to disk, which must not stall the event loop.
                await asyncio.to_thread(on_result, i, gen)
            return gen

        async def every() -> list[Generation]:
            return list(await asyncio.gather(*map(one, range(len(conversations)))))

        self.outage = None  # each batch tries the service afresh, every server included
        self._pool.reset()
        return self._loop.run(every())

    def close(self, wait_s: float = CLOSE_TIMEOUT_S) -> None:
        """Waits at most ``wait_s`` for each of the connections and the loop (nothing at
        interpreter exit, where the loop's thread is frozen)."""
        client, self._client = getattr(self, "_client", None), None
        loop = getattr(self, "_loop", None)
        if loop is None:
            return
        if sys.is_finalizing():
            wait_s = 0.0
        try:
            if client is not None and loop.running:
                if wait_s > 0:
                    loop.run(client.close(), timeout=wait_s)
                else:
                    asyncio.run_coroutine_threadsafe(client.close(), loop.loop)
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
