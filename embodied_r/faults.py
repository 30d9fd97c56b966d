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

Secrets: every backend config names the variable its API key is in
(:func:`register_secret_env`) and every backend built registers the key it sends
(:func:`register_secret`), so :func:`redact` removes the values themselves, whatever their
form (hex, JWT...), beside the shapes keys usually have.

Stages mark their item boundaries with :func:`item_done`, where a test can make a stage stop
and wait to be killed (``EMBODIED_R_STALL_AT``); unset, it does nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Literal

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


class NotTransient(Exception):
    """An error a retry cannot get past, raised where this module must not name it (in its key)."""


class DiskFull(StageFault):
    """A disk filled under a stage or a store. The message names the folder, what is free and
    the fix; a retry cannot succeed until space is made."""


# errno values that mean "no room": ENOSPC, and EDQUOT (a quota is a full disk to the user).
_NO_ROOM = {28, 122}
# SQLite's SQLITE_FULL as its Python driver (and SQLAlchemy, and MLflow above it) words it.
_SQLITE_FULL = "database or disk is full"


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from or during, each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it came from, is a full disk (or quota)."""
    for e in causes(exc):
        if isinstance(e, DiskFull) or (isinstance(e, OSError) and e.errno in _NO_ROOM):
            return True
        if _SQLITE_FULL in str(e):
            return True
    return False


def full_path(exc: BaseException | None) -> str:
    """The file the first full-disk error along ``exc``'s chain was writing, where it says;
    "" otherwise (SQLite's error names no file: the store's own folder is the caller's to say).
    The first, not any: a store's error raised while a stage's full disk was being handled
    carries the stage's error as its context."""
    for e in causes(exc):
        if isinstance(e, OSError) and e.errno in _NO_ROOM:
            return str(e.filename or "")
        if isinstance(e, DiskFull) or _SQLITE_FULL in str(e):
            return ""
    return ""


def size_text(n: float) -> str:  # a small model's checkpoints are not "0.0 GB"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} bytes"


def free_text(path: str | os.PathLike[str]) -> str:
    """What is free on the disk of ``path`` (its nearest existing parent), or "" when unknown."""
    p = next((q for q in (Path(path), *Path(path).parents) if q.exists()), Path("/"))
    try:
        return size_text(shutil.disk_usage(p).free)
    except OSError:
        return ""


def disk_full_line(what: str, folder: str | os.PathLike[str], need: str = "", store: bool = False) -> str:
    """The one line for a full disk under ``folder`` while ``what`` wrote there: what is free
    (and ``need``, where the writer knew it) and where to make room."""
    free = free_text(folder)
    sizes = "; ".join(part for part in (f"needs about {need}" if need else "", f"{free} free" if free else "") if part)
    move = ("point the tracking store (tracking.tracking_uri, or MLFLOW_TRACKING_URI) to a larger disk" if store
            else "move the project home (EMBODIED_R_HOME) to a larger disk")
    return (f"{what}: the disk under {folder} is full{f' ({sizes})' if sizes else ''}: free space there or {move}, "
            "then run the same command again")


# Which failures a retry of the whole stage can get past. A stage resumes per item, so a retry
# is cheap when the cause may pass (a dropped connection, a server restarting, a killed
# worker); a cause that is still there a moment later only makes the user wait for the same
# error. Named by class (module and name, matched along the class's bases) so that this
# module imports none of the modules that raise them.
NOT_TRANSIENT: tuple[tuple[str, str, str], ...] = (
    ("embodied_r.faults", "StageFault", "stopped on purpose: an outage after the backend's own retries, too "
                                        "many failed items, a full disk, a damaged finished folder"),
    ("embodied_r.io", "StageBusy", "another run holds the stage's lock"),
    ("embodied_r.paths", "HomeMovedError", "the project home was moved"),
    ("embodied_r.paths", "HomeUnusable", "the project home cannot be created or written"),
    ("embodied_r.tracking.store", "TrackingUnavailable", "the tracking store does not answer"),
    ("builtins", "ValueError", "a value refused: a configuration error (RecipeError, pydantic's ValidationError, "
                               "StageError), a damaged or refused source (DataSourceError, CatalogError)"),
    ("builtins", "FileNotFoundError", "an input that is missing"),
    ("builtins", "PermissionError", "a folder or file the stage may not write"),
    ("builtins", "IsADirectoryError", "a folder where a file belongs"),
    ("builtins", "NotADirectoryError", "a file where a folder belongs"),
    ("pyarrow.lib", "ArrowInvalid", "an input that does not read (a damaged Parquet file)"),
    ("zipfile", "BadZipFile", "a damaged archive"),
    ("embodied_r.faults", "NotTransient", "too little disk for the checkpoints (DiskSpaceError), a video that cannot be used (VideoError)"),
)


def transient(exc: BaseException) -> bool:
    """Whether a retry of the stage that raised ``exc`` may succeed: not for a full disk or a
    read-only file system (errno 30, a plain OSError), nor for anything in :data:`NOT_TRANSIENT`."""
    if disk_full(exc) or any(isinstance(e, OSError) and e.errno == 30 for e in causes(exc)):
        return False
    names = {f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__}
    return not any(f"{module}.{name}" in names for module, name, _ in NOT_TRANSIENT)


# Things that look like credentials, in the forms servers echo them back.
_SECRET_PATTERNS = [
    # "Authorization: Bearer xyz", "bearer xyz", "Basic xyz"
    re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=\-]{4,}"),
    # Keys by their well-known prefixes (OpenAI, Anthropic, HF, GitHub, AWS, Google).
    re.compile(r"\b(sk-[A-Za-z0-9_\-]{8,}|sk_[A-Za-z0-9_\-]{8,}|hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}"
               r"|AKIA[0-9A-Z]{12,}|AIza[0-9A-Za-z_\-]{20,}"
               # JSON web tokens: base64url header and payload, both JSON objects ("eyJ").
               r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*)"),
    # key=value / "api_key": "value" pairs whose name says they are secret.
    re.compile(r"(?i)([\"']?\b(?:api[_-]?key|x-api-key|access[_-]?token|auth[_-]?token|secret|password|token)"
               r"[\"']?\s*[:=]\s*[\"']?)([^\s\"',;}&]{4,})"),
]

REDACTED = "[REDACTED]"

# Shorter values are too likely to be ordinary words ("test", a placeholder) to be masked
# wherever they occur; no real API key is this short.
MIN_SECRET_LENGTH = 8
_secret_values: set[str] = set()
_secret_envs: set[str] = set()
_secrets_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """A value this process sends as a credential (an API key, an ``Authorization`` header's
    value): :func:`redact` removes it from every text from now on."""
    value = (value or "").strip()
    if len(value) >= MIN_SECRET_LENGTH:
        with _secrets_lock:
            _secret_values.add(value)


def register_secret_env(name: str | None) -> None:
    """An environment variable that holds a credential: its value at the time of each
    :func:`redact` is removed. Registered by every backend config, so a process that only
    reports an error (the CLI, a flow) knows the keys its stages send."""
    if name:
        with _secrets_lock:
            _secret_envs.add(name)


def known_secrets() -> list[str]:
    """Every credential value this process knows, longest first (a key that contains
    another is masked whole)."""
    with _secrets_lock:
        values = set(_secret_values)
        names = list(_secret_envs)
    for name in names:
        value = (os.environ.get(name) or "").strip()
        if len(value) >= MIN_SECRET_LENGTH:
            values.add(value)
    return sorted(values, key=len, reverse=True)


def _redact_values(text: str) -> str:
    from urllib.parse import quote

    for value in known_secrets():
        # As sent, and as a server may echo it inside a URL or a JSON string.
        for form in {value, quote(value, safe=""), json.dumps(value)[1:-1]}:
            if form in text:
                text = text.replace(form, REDACTED)
    return text


def redact(text: str | None) -> str | None:
    """``text`` without the values of the credentials this process knows and without
    anything that looks like a bearer token or an API key.

    Applied to every error text before it is stored (Parquet, summaries, MLflow) or
    logged: a server that echoes the key it was sent must not put it on disk."""
    if not text:
        return text
    text = _redact_values(text)
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


# How FFmpeg starts each of its messages: "[mov,mp4,m4a,3gp,3g2,mj2 @ 0x55d0c0a0b700] ...".
_FFMPEG_LINE = re.compile(rb"^\[[^\]\n]* @ 0x[0-9a-f]+\] ")
_native_lock = threading.Lock()


@contextmanager
def ffmpeg_messages() -> Iterator[list[str]]:
    """FFmpeg's messages printed inside the block (by OpenCV, to file descriptor 2), kept in the
    yielded list for the caller to attach to its video: a bare "moov atom not found" names no
    video. Anything else written meanwhile is passed on; one block at a time per process."""
    import sys
    import tempfile

    found: list[str] = []
    with _native_lock, tempfile.TemporaryFile() as held:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield found
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            other = []
            for line in held.read().splitlines(keepends=True):
                if _FFMPEG_LINE.match(line):
                    found.append(" ".join(line[line.index(b"] ") + 2:].decode(errors="replace").split()))
                else:
                    other.append(line)
            if other:
                os.write(2, b"".join(other))


PARENT_PID_ENV = "EMBODIED_R_PARENT_PID"


@contextmanager
def children_deaf_to_ctrl_c() -> Iterator[None]:
    """Children started inside this block are born with SIGINT blocked.

    A terminal's Ctrl-C reaches the whole process group, children included, and a child
    still importing its modules (a spawned key-frame worker, a trainer loading torch) has not
    yet reached ``die_with_parent``'s ignore: it would die printing a traceback of its own
    under the run's one line. A blocked signal mask is inherited across fork and exec, so the
    child never sees the terminal's Ctrl-C; the parent, which does, ends it. Only the calling
    thread's mask changes, and a Ctrl-C that lands meanwhile waits, it is not lost."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


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

