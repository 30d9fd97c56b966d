"""The servers of one model behind the ``openai`` backend: the least busy takes the next call;
one that cannot be reached, or fails ``faults_to_leave`` calls in a row, is left out for the
rest of the ``generate()`` batch (never the last)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Unreachable (refused, unknown host): left out at once. A fault (5xx, timeout, dropped
# connection): after ``faults_to_leave`` in a row. Rate limits and bad replies are no fault.
UNREACHABLE = "unreachable"
FAULT = "fault"


@dataclass
class Server:
    base_url: str
    in_flight: int = 0
    sent: int = 0
    faults: int = 0  # server faults in a row
    out: str | None = None  # why it is out of the rotation, while it is


class ServerPool:
    """Used from the backend's one event loop only, so plain counters need no lock."""

    def __init__(self, base_urls: list[str], concurrency: int, faults_to_leave: int):
        self.servers = [Server(u.rstrip("/")) for u in base_urls]
        self.concurrency = concurrency
        self.faults_to_leave = max(1, faults_to_leave)
        # One slot per call in flight on any server: a released slot wakes one waiting call,
        # where waking all of them (hundreds in a large batch) costs more than the call.
        self._slots = asyncio.Semaphore(concurrency * len(self.servers))
        self._changed = asyncio.Condition()  # for the calls that wait while servers are out

    @property
    def several(self) -> bool:
        return len(self.servers) > 1

    def live(self) -> list[Server]:
        return [s for s in self.servers if s.out is None]

    def reset(self) -> None:
        for server in self.servers:
            server.out, server.faults = None, 0

    def _free(self) -> Server | None:
        free = [s for s in self.live() if s.in_flight < self.concurrency]
        if not free:
            return None
        # Ties go to the one sent the fewest so far, so that calls made one at a time alternate.
        return min(free, key=lambda s: (s.in_flight, s.sent, self.servers.index(s)))

    async def acquire(self) -> Server:
        await self._slots.acquire()
        try:
            async with self._changed:
                while (server := self._free()) is None:
                    await self._changed.wait()
                server.in_flight += 1
                server.sent += 1
                return server
        except BaseException:  # cancelled while waiting: the slot was never used
            self._slots.release()
            raise

    async def release(self, server: Server) -> None:
        async with self._changed:
            server.in_flight -= 1
            self._changed.notify_all()
        self._slots.release()

    def answered(self, server: Server) -> None:
        server.faults = 0

    def failed(self, server: Server, kind: str, error: str) -> bool:
        """True when the server is out of the rotation (now or already): the call goes on to
        another without spending its retries."""
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
        """One line for a failure that stops the stage, naming every server that failed."""
        if not self.several:
            return error
        others = [f"{s.base_url} ({s.out})" for s in self.servers if s.out is not None and s is not server]
        if not others:
            return f"{server.base_url}: {error}"
        return "; ".join([f"no server answers: {server.base_url} ({error})", *others])
