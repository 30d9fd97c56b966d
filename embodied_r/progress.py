"""Progress of long stages, reported to whoever listens (a CLI bar, a Prefect artifact);
free when no one listens, and a failing listener never stops the work."""

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


# Where the run is now: the stage last begun and its last count, for a line on interrupt.
_where: dict[str, object] = {}


def begin(stage: str, unit: str = "items") -> None:
    """``stage`` has started (its counts come with its first ``update``); ``unit`` is what it counts."""
    with _lock:
        _where.clear()
        _where.update(stage=stage, unit=unit)


def where(timeout: float = -1) -> tuple[str, int, int] | None:
    """(stage, done, total) of the stage under way; done and total are -1 before its first
    count. With ``timeout`` (a signal handler, which may have interrupted a holder of the
    lock) None when the lock is not free in time."""
    if not _lock.acquire(timeout=timeout):
        return None
    try:
        if "stage" not in _where:
            return None
        return str(_where["stage"]), int(_where.get("done", -1)), int(_where.get("total", -1))  # type: ignore[call-overload]
    finally:
        _lock.release()


def stopped_line(stopped: str) -> str:
    """The one line of a run stopped under way (``interrupted``, ``cancelled``): where it was."""
    at = where(timeout=0.5)
    if at is None:
        return f"{stopped} before any stage started; rerun to start again"
    stage, done, total = at
    if done < 0:
        return f"{stopped} during {stage}, before its first item finished; rerun to resume"
    unit = _where.get("unit", "items")  # read without the lock, which the stopped run may hold
    return f"{stopped} during {stage}: {done} of {total} {unit} done; rerun to resume"


def keep(count: int) -> None:
    """``count`` items of the stage under way came back from the log of an interrupted run; its
    done line says so."""
    if count:
        with _lock:
            _where["kept"] = int(_where.get("kept", 0)) + count  # type: ignore[call-overload]


def kept() -> int:
    """The items the stage under way kept from an interrupted run (``keep``)."""
    with _lock:
        return int(_where.get("kept", 0))  # type: ignore[call-overload]


def update(stage: str, done: int, total: int) -> None:
    with _lock:
        listeners = list(_listeners)
        # The library counts under its stage kind ("evaluate"); the run names the stage
        # ("evaluate_untrained"), which is the name a user reruns.
        _where.setdefault("stage", stage)
        _where.update(done=done, total=total)
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
        global _bars_open
        import sys

        from tqdm import tqdm

        bar = self._bars.get(stage)
        if bar is None:
            unit = "step" if stage.startswith("train") else "item"
            bar = self._bars[stage] = tqdm(total=total, desc=f"{stage:<13}", unit=unit, leave=False,
                                           file=sys.stderr, dynamic_ncols=True)
            _bars_open += 1
        bar.total = total
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()
            self._bars.pop(stage, None)
            _bars_open -= 1


# -- terminal lines --------------------------------------------------------------------------

_bars_open = 0


def say(text: str) -> None:
    """One line for the terminal; above the bars when some are drawn (so none is torn)."""
    import sys

    if _bars_open:
        from tqdm.auto import tqdm

        tqdm.write(text, file=sys.stdout)
    else:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def stage_line(stage: str, event: str, seconds: float | None = None, note: str = "") -> str:
    """``[stage] train_stage1   done    12.3 s  note``: one line per stage event."""
    took = f"{seconds:7.1f} s" if seconds is not None else " " * 9
    return f"[stage] {stage:<13} {event:<8} {took}" + (f"  {note}" if note else "")


def duration(seconds: float) -> str:
    """``45 s``, ``3 min 20 s``, ``1 h 05 min``: a wait as a reader takes it in."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Pace:
    """The time a stage has left, from the pace of the steps seen so far (its start, the model's
    loading and a resume's skipped steps left out): a note for its step lines."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.first: tuple[int, float] | None = None

    def note(self, step: object, total: object) -> str:
        if not isinstance(step, int) or not isinstance(total, int):
            return ""
        now = self.clock()
        if self.first is None or step <= self.first[0]:
            self.first = (step, now)
            return ""
        if step >= total:
            return ""
        per_step = (now - self.first[1]) / (step - self.first[0])
        return f"  ~{duration(per_step * (total - step))} left"


def step_line(record: dict) -> str:
    """One training step in a line: stage, step/total, then for GRPO the total reward, each
    component and KL; for SFT the loss, the token accuracy and the learning rate."""
    def num(value: object, digits: int = 3) -> str:
        return "-" if not isinstance(value, (int, float)) else f"{value:.{digits}f}"

    head = f"  {record.get('stage', ''):<13} step {record.get('step')}/{record.get('total')}"
    if "loss" in record and "reward" not in record:
        lr = record.get("lr")
        rate = f"{lr:.2e}" if isinstance(lr, (int, float)) else "-"
        return (f"{head}  loss {num(record.get('loss'), 4)}  token acc {num(record.get('token_accuracy'))}  "
                f"lr {rate}")
    parts = "  ".join(f"{name} {num(value)}" for name, value in (record.get("components") or {}).items())
    return (f"{head} (global {record.get('global')})  reward {num(record.get('reward'))}  {parts}  "
            f"kl {num(record.get('kl'), 4)}").rstrip()
