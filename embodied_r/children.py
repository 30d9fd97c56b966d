"""The processes a run starts: deaf to the terminal's Ctrl-C, and ended with their parent."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

PARENT_PID_ENV = "EMBODIED_R_PARENT_PID"


@contextmanager
def children_deaf_to_ctrl_c() -> Iterator[None]:
    """Children started in this block are born with SIGINT blocked (a mask survives fork and exec),
    so one still importing prints no traceback of its own; the parent ends them, and a Ctrl-C
    landing meanwhile waits, not lost."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def die_with_parent(parent_pid: int | None = None, poll_s: float = 1.0) -> None:
    """End this process when ``parent_pid`` (default: our parent now) dies, even by kill -9: the
    kernel's ``PR_SET_PDEATHSIG`` on Linux, backed by a thread polling the parent (other systems, a
    launcher such as ``accelerate`` in between). Key-frame workers and trainers call it first."""
    parent = parent_pid or os.getppid()
    # A Ctrl-C reaches the terminal's whole process group: the parent stops the run and ends
    # its children, which must not each print a traceback of their own meanwhile.
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: its process is not one we started
        pass
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    direct = os.getppid()  # reparenting (to init or a subreaper) means it died
    if not alive(parent):
        os._exit(137)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if not alive(parent) or os.getppid() != direct:
                os._exit(137)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()
