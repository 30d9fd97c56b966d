"""Ctrl-C and SIGTERM end a run at once, as a kill would (its work is safe against one), only
tidily: one line saying where it stopped, every process it started ended, exit 128 + the signal.
Unwinding instead through Prefect's retries and a server the same Ctrl-C stopped took minutes and
a page of tracebacks."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import Callable

from embodied_r import progress

SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 2.0

_stopping = threading.Lock()


def _end_children() -> None:
    """SIGKILL every process this one started, at any depth, and wait until they are gone: every
    stage survives a kill, and a gentler signal would let each child print after the run's line."""
    from embodied_r.apps.reaper import descendants, running

    left = descendants(os.getpid())
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(running(p, s) for p, s in left.items()):
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # reap our own children as they die
                pass
        except ChildProcessError:
            pass
        time.sleep(0.05)


def stop(signum: int) -> None:
    end(lambda: progress.stopped_line("interrupted"), "interrupted; rerun to resume", 128 + signum)


def end(line: Callable[[], str], fallback: str, status: int) -> None:
    """The tidy kill shared by signals and by a Prefect API that is gone."""
    if not _stopping.acquire(blocking=False):
        while True:  # the other path is stopping the process; never unwind meanwhile
            time.sleep(1)
    try:
        text = line()
    except Exception:  # noqa: BLE001 - the line must come whatever state the run is in
        text = fallback
    clear = "\r\033[K" if sys.stderr.isatty() else ""
    try:
        # Silence the process first, then write the line through a copy of stderr: threads
        # unwinding meanwhile (the main one too, under Prefect's handler) print nothing.
        terminal = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.write(terminal, f"{clear}{text}\n".encode())
    except OSError:
        pass
    try:
        _end_children()
    finally:
        os._exit(status)


def _handler(signum: int, frame: FrameType | None) -> None:
    stop(signum)


def _watch(reader: socket.socket) -> None:
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return
        for value in data:
            if value in SIGNALS:
                stop(value)


def install() -> None:
    """Main thread only. Prefect replaces the SIGTERM handler while a flow runs, so the signal is
    also read from Python's wakeup fd by a thread of ours, which sees every signal that has a
    Python handler and acts without waiting for the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        reader.close()
        writer.close()
    else:
        # The pair lives as long as the process: the wakeup fd must stay open.
        install.sockets = (reader, writer)  # type: ignore[attr-defined]
        threading.Thread(target=_watch, args=(reader,), name="interrupt-watch", daemon=True).start()
    for signum in SIGNALS:
        signal.signal(signum, _handler)
