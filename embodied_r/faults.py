"""How stages tell an item's bad input from an outage, and keep secrets out of error text.

Two kinds of failure, treated differently:

- ``item``: one item's own input is bad (an unreadable video, a reply that cannot be
  parsed, a request the server rejects as invalid). It is recorded with its reason and
  the stage goes on.
- ``infra``: the service or machine failed (connection refused, timeouts, 5xx or 429
  after the retry budget, auth errors). Going on would record an outage as a result for
  every remaining item, so the stage stops with :class:`InfraFailure`; its folder stays
  ``.partial`` and a re-run resumes with the missing items.

A stage whose item failures exceed its ``max_failed_fraction`` stops with
:class:`TooManyFailures`: it is never renamed to its final name, so it is not cached.

Stages mark their item boundaries with :func:`item_done`, where a test can make a stage stop
and wait to be killed (``EMBODIED_R_STALL_AT``); unset, it does nothing.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Literal

ErrorKind = Literal["infra", "item"]

DEFAULT_MAX_FAILED_FRACTION = 0.05


class StageFault(RuntimeError):
    """A stage stopped before its end; its partial folder is kept for the re-run."""


class InfraFailure(StageFault):
    """A service the stage depends on failed after its retries."""


class TooManyFailures(StageFault):
    """More items failed than the recipe's ``max_failed_fraction`` allows."""


class WriteFailure(StageFault):
    """A finished item could not be written (a full disk, a read-only folder): going on
    would do work that cannot be kept."""


# Things that look like credentials, in the forms servers echo them back.
_SECRET_PATTERNS = [
    # "Authorization: Bearer xyz", "bearer xyz", "Basic xyz"
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{4,}"),
    # Keys by their well-known prefixes (OpenAI, Anthropic, HF, GitHub, AWS, Google).
    re.compile(r"\b(sk-[A-Za-z0-9_\-]{8,}|sk_[A-Za-z0-9_\-]{8,}|hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}"
               r"|AKIA[0-9A-Z]{12,}|AIza[0-9A-Za-z_\-]{20,})"),
    # key=value / "api_key": "value" pairs whose name says they are secret.
    re.compile(r"(?i)([\"']?\b(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret|password|token)"
               r"[\"']?\s*[:=]\s*[\"']?)([^\s\"',;}&]{4,})"),
]

REDACTED = "[REDACTED]"


def redact(text: str | None) -> str | None:
    """``text`` with anything that looks like a bearer token or an API key replaced.

    Applied to every error text before it is stored (Parquet, summaries, MLflow) or
    logged: a server that echoes request headers must not put the key on disk."""
    if not text:
        return text
    out = _SECRET_PATTERNS[0].sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    out = _SECRET_PATTERNS[1].sub(REDACTED, out)
    out = _SECRET_PATTERNS[2].sub(lambda m: m.group(1) + REDACTED, out)
    return out


def check_failed_fraction(stage: str, failed: int, total: int, limit: float, detail: str = "") -> None:
    """Raise :class:`TooManyFailures` when ``failed / total`` exceeds ``limit``."""
    if total and failed / total > limit:
        raise TooManyFailures(
            f"{stage}: {failed} of {total} items failed ({failed / total:.1%}), above the recipe's "
            f"max_failed_fraction {limit:g}{'; ' + detail if detail else ''}. The work done is kept in the "
            f"stage's .partial folder: fix the cause and run again to redo only the failed items, "
            f"or raise {stage}.max_failed_fraction (the same folder resumes)"
        )


PARENT_PID_ENV = "EMBODIED_R_PARENT_PID"


def die_with_parent(parent_pid: int | None = None, poll_s: float = 1.0) -> None:
    """Make this process end when ``parent_pid`` (default: our parent now) dies, even by kill -9.

    On Linux the kernel sends SIGKILL at the parent's death (``PR_SET_PDEATHSIG``); a
    daemon thread polling the parent's pid backs it up (other systems, and children whose
    parent is a launcher such as ``accelerate``). Called first thing in children: key-frame
    pool workers and trainers must not keep working for a run that is gone."""
    import os
    import signal
    import sys
    import threading
    import time

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


# -- a kill at a known point -------------------------------------------------------------

STALL_ENV = "EMBODIED_R_STALL_AT"
STALL_MARKER_ENV = "EMBODIED_R_STALL_MARKER"
_stall_counts: dict[str, int] = {}
_stall_lock = threading.Lock()


def item_done(stage: str) -> None:
    """An item boundary of ``stage``, where a fault can be injected for kill tests.

    Unset (always, outside tests), this is one environment lookup. With
    ``EMBODIED_R_STALL_AT=<stage>:<n>`` the stage, once it has finished its n-th item in this
    process, creates the file ``$EMBODIED_R_STALL_MARKER`` (when set) and sleeps for an hour,
    so a test can SIGKILL it at a known point instead of racing a stage that takes a second.
    Only the place of the kill is arranged; the kill itself is a real one. Other threads of
    the stage that reach a boundary meanwhile wait behind the sleeping one."""
    spec = os.environ.get(STALL_ENV)
    if not spec:
        return
    name, _, n = spec.rpartition(":")
    if name != stage:
        return
    with _stall_lock:
        _stall_counts[stage] = count = _stall_counts.get(stage, 0) + 1
        if count != int(n):
            return
        import sys
        import time

        if marker := os.environ.get(STALL_MARKER_ENV):
            with open(marker, "w", encoding="utf-8") as fh:
                fh.write(f"{stage}:{count} {os.getpid()}\n")
        print(f"{STALL_ENV}: {stage} stalled after item {count}", file=sys.stderr, flush=True)
        time.sleep(3600)

