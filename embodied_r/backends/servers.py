"""Several servers of one model behind the ``openai`` backend: which one takes the next
call, and which are left out of the rotation.

Each server takes up to ``concurrency`` calls at once. A call goes to the server with the
fewest calls in flight (ties: the one sent the fewest so far, so that calls made one at a
time still alternate), and waits while every server is full.

A server is left out of the rotation, for the rest of one ``generate()`` batch, when
- no connection can be made to it at all (refused, unknown host: aiohttp's
  ``ClientConnectorError``): at once, since nothing listens there;
- it fails ``faults_to_leave`` calls in a row with a server fault (an HTTP 5xx, a
  timeout, a connection dropped mid-call): the budget one call has before its failure
  counts as an outage (``max_retries + 1``).
Rate limits (429, 408), malformed or empty replies and refusals of one input are not
server faults: the server is up and answering. A call whose server is left out goes on
to another at once, without spending its own retries. The last server in the rotation is
never left out: its failures go through the call's retries as with one server, and the
outage that may follow names every server and why each is out. The next batch tries every
server again, so one that was restarted rejoins.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

UNREACHABLE = "unreachable"
FAULT = "fault"


@dataclass
class Server:
    base_url: str
    endpoint: str  # the chat-completions URL
    in_flight: int = 0
    sent: int = 0
    faults: int = 0  # server faults in a row
    out: str | None = None  # why it is out of the rotation, while it is


def server_fault(exc: BaseException, aiohttp: Any, status: int | None) -> str | None:
    """UNREACHABLE, FAULT (the server's own failure) or None (it answered)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UNREACHABLE
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ClientConnectionError)):
        return FAULT
    if status is not None and status >= 500:
        return FAULT
    return None


class ServerPool:
    """The servers of one backend, their calls in flight and their health. Used from the
    backend's one event loop only, so plain counters need no lock."""

    def __init__(self, base_urls: list[str], concurrency: int, faults_to_leave: int):
        self.servers = [Server(u.rstrip("/"), u.rstrip("/") + "/chat/completions") for u in base_urls]
        self.concurrency = concurrency
        self.faults_to_leave = max(1, faults_to_leave)
        self._changed = asyncio.Condition()

    @property
    def several(self) -> bool:
        return len(self.servers) > 1

    def live(self) -> list[Server]:
        return [s for s in self.servers if s.out is None]

    def reset(self) -> None:
        """Every server back in the rotation, for a new batch. Calls in flight are kept."""
        for server in self.servers:
            server.out, server.faults = None, 0

    def _free(self) -> Server | None:
        free = [s for s in self.live() if s.in_flight < self.concurrency]
        if not free:
            return None
        return min(free, key=lambda s: (s.in_flight, s.sent, self.servers.index(s)))

    async def acquire(self) -> Server:
        """A slot on the least busy server in the rotation, once one is free."""
        async with self._changed:
            while (server := self._free()) is None:
                await self._changed.wait()
            server.in_flight += 1
            server.sent += 1
            return server

    async def release(self, server: Server) -> None:
        async with self._changed:
            server.in_flight -= 1
            self._changed.notify_all()

    def answered(self, server: Server) -> None:
        server.faults = 0

    def failed(self, server: Server, kind: str, error: str) -> bool:
        """Record a server fault of ``kind``; True when the server is out of the rotation
        (now or already), so the call goes on to another without spending its retries."""
        if server.out is not None:
            return True
        server.faults += 1
        if len(self.live()) > 1 and (kind == UNREACHABLE or server.faults >= self.faults_to_leave):
            server.out = error if kind == UNREACHABLE else f"{server.faults} failures in a row, the last: {error}"
            log.warning("server %s left out of the rotation (%s); %d still answer",
                        server.base_url, server.out, len(self.live()))
            return True
        return False

    def outage(self, server: Server, error: str) -> str:
        """One line for a failure that stops the stage: with several servers, every one of
        them and why it failed."""
        if not self.several:
            return error
        others = [f"{s.base_url} ({s.out})" for s in self.servers if s.out is not None and s is not server]
        if not others:
            return f"{server.base_url}: {error}"
        return "; ".join([f"no server answers: {server.base_url} ({error})", *others])
