"""Progress of long stages, reported to whoever listens (a CLI bar, a Prefect artifact).

Library code calls ``progress.update(stage, done, total)``; it costs nothing when no one
listens, and a failing listener never stops the work.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

Listener = Callable[[str, int, int], None]

_listeners: list[Listener] = []
_lock = threading.Lock()
log = logging.getLogger(__name__)


def update(stage: str, done: int, total: int) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(stage, done, total)
        except Exception:  # noqa: BLE001 - progress display must never fail a stage
            log.debug("progress listener failed", exc_info=True)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    with _lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)


class Throttled:
    """Call ``fn`` at most every ``seconds`` per stage, and always on the last item."""

    def __init__(self, fn: Listener, seconds: float = 2.0):
        self.fn = fn
        self.seconds = seconds
        self._last: dict[str, float] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        last = self._last.get(stage)
        if last is None or done >= total or now - last >= self.seconds:
            self._last[stage] = now
            self.fn(stage, done, total)


class TerminalBar:
    """A one-line bar per stage on a terminal (tqdm, which transformers already needs)."""

    def __init__(self) -> None:
        self._bars: dict[str, object] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm.auto import tqdm

        bar = self._bars.get(stage)
        if bar is None:
            bar = self._bars[stage] = tqdm(total=total, desc=stage, unit="item", leave=True)
        bar.total = total
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()
            self._bars.pop(stage, None)
