"""Whether the MLflow tracking store answers: checked before a run, watched during it.

An HTTP store that does not answer costs MLflow's client minutes on each call (seven retries
with a doubling back-off, about 4.5 minutes) before it raises. So ``check_store`` asks the
server once, with a short timeout, before a run's first stage and at ``validate``, and names
the fixes in one line. During a run every call through ``Tracker.client`` asks first too (a
GET of the server's ``/health``, a millisecond on 127.0.0.1): a server that died is found at
once and marked lost, and every later call fails at once with :class:`TrackingLost`. The
run's bookkeeping (``guard``) catches it and goes on without tracking: the stages' work is on
disk, and a rerun with the server back logs what is missing, as it logs any cached stage.

A local store (SQLite, files) has no server and is never checked; its client is guarded all
the same, for a full disk: the first call that fails on one marks the store lost, in one line
naming the folder and the fix, and every later call is skipped as for a server gone. Going on
matters more than the record: the stages' work is on disk, and the rerun logs what is missing.
A store that becomes read-only mid-run is lost the same way.

A local store that cannot be opened at all is named before anything runs (``check_store``,
``store_open``); what only opening it finds is said the same way (``store_error``).
"""

from __future__ import annotations

import functools
import os
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from embodied_r import progress
from embodied_r.errors import TrackingLost, TrackingUnavailable, causes, disk_full, full_path
from embodied_r.paths import disk_full_line, fs_fault, refused
from embodied_r.store_open import is_remote, opening_line, or_the_local_store, unwritable_why

# Long enough for a busy server to answer its health check, short enough to say at once
# that nothing does.
CHECK_TIMEOUT_S = 5.0
START_SCRIPT = "infra/start-mlflow.sh"
# A proxy's own answers that say the server behind it is gone.
_GONE_STATUSES = (502, 503, 504)


_lock = threading.Lock()
_lost: dict[str, dict[str, str]] = {}  # uri -> {"why", "where", "said", "full"}, once found gone


def unanswered(uri: str, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """Why the server of ``uri`` does not answer, or None when it does (any HTTP answer but a
    proxy's "gone" is the server's own)."""
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
            return None
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} from the proxy before it" if exc.code in _GONE_STATUSES else None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused"
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout_s:g} s"
        return " ".join(str(reason).split()) or type(reason).__name__


def fixes(uri: str) -> str:
    """How to get a store that answers: start the server, or use the local one."""
    parts = urlsplit(uri)
    port = f"MLFLOW_PORT={parts.port} " if parts.hostname in ("127.0.0.1", "localhost") and parts.port not in (
        None, 5000) else ""
    return f"start it ({port}{START_SCRIPT}){or_the_local_store(uri)}"


@contextmanager
def opening(uri: str) -> Iterator[None]:
    """A block that opens the store ``uri``: what only opening finds (a damaged database, a
    driver's refusal) is raised as :class:`TrackingUnavailable` in one line naming the store
    (``store_open``), not in SQLAlchemy's words. A full disk stays the full disk it is, and an
    error that is not the store's (a bug of ours) goes on as it is."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, TrackingUnavailable) or disk_full(exc) or (line := opening_line(uri, exc)) is None:
            raise
        raise TrackingUnavailable(line) from exc


def check_store(uri: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Raise :class:`TrackingUnavailable`, in one line naming the fixes, when the store ``uri``
    cannot be used: a local one that cannot be opened (``store_problem``), an HTTP one that does
    not answer within ``timeout_s``; a store that answers is no longer lost."""
    if not is_remote(uri):
        if (line := opening_line(uri)) is not None:
            raise TrackingUnavailable(line)
        return
    why = unanswered(uri, timeout_s)
    if why is not None:
        raise TrackingUnavailable(f"the MLflow tracking server at {uri} does not answer ({why}): {fixes(uri)}")
    with _lock:
        _lost.pop(uri, None)


def tracking_lost(uri: str) -> bool:
    with _lock:
        return uri in _lost


def mark_lost(uri: str, why: str, where: str = "", full: str = "", unwritable: str = "") -> None:
    """``full``: the folder whose disk filled, ``unwritable``: the path that cannot be written,
    when that is why a local store is lost."""
    with _lock:
        _lost.setdefault(uri, {"why": why, "where": where, "said": "", "full": full, "unwritable": unwritable})


def store_folder(uri: str) -> str:
    """The folder a local store's files are in (a SQLite file's folder); the URI otherwise."""
    if uri.startswith("sqlite:///"):
        return os.path.dirname(uri[len("sqlite:///"):]) or "."
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri if "://" not in uri else ""


def _local(state: dict[str, str]) -> bool:
    return bool(state.get("full") or state.get("unwritable"))


def _local_text(uri: str, state: dict[str, str]) -> str:
    """Why a local store was lost, with the fix: its disk filled, or it became read-only."""
    if state.get("full"):
        return disk_full_line(f"the MLflow store {uri}", state["full"], store=True)
    return f"the MLflow store {uri} cannot be written ({state['why']}): make {state['unwritable']} writable" \
           f"{or_the_local_store(uri)}"


def _lost_error(uri: str) -> TrackingLost:
    with _lock:
        state = dict(_lost.get(uri, {}))
    if _local(state):
        return TrackingLost(f"tracking lost: {_local_text(uri, state)}")
    return TrackingLost(f"tracking lost: the MLflow server at {uri} stopped answering ({state.get('why', '')})")


# SQLite's words for a database it may read but not write (its file or folder read-only).
_READ_ONLY = ("attempt to write a readonly database", "unable to open database file")


def lost_to_its_disk(uri: str, exc: BaseException) -> bool:
    """Mark the store of ``uri`` lost when ``exc`` is a full disk under it (its database or
    its artifacts), or a local store's file or folder that became read-only; whether it was."""
    if disk_full(exc):
        mark_lost(uri, "its disk is full", full=os.path.dirname(full_path(exc)) or store_folder(uri) or uri)
        return True
    if is_remote(uri):
        return False
    # The store's own error comes first along the chain; a stage's, being handled when the
    # store's call failed, comes after it and is not the store's to report.
    own = next((e for e in causes(exc) if refused(e) is e or any(words in str(e) for words in _READ_ONLY)), None)
    if own is None:
        return False
    if isinstance(own, OSError):
        path, why = fs_fault(own)
    else:
        path = Path(store_folder(uri))
        why = unwritable_why(path) or "is read-only to SQLite"
    mark_lost(uri, f"{path} {why}", unwritable=str(path))
    return True


def ensure_answers(uri: str) -> None:
    """Raise :class:`TrackingLost` at once when the store of ``uri`` is lost or stops
    answering now."""
    if not is_remote(uri):
        if tracking_lost(uri):
            raise _lost_error(uri)
        return
    if not tracking_lost(uri):
        why = unanswered(uri)
        if why is None:
            return
        mark_lost(uri, why)
    raise _lost_error(uri)


class GuardedClient:
    """An ``MlflowClient`` whose every call first makes sure its server answers
    (``ensure_answers``), and whose call that fails on a server gone raises
    :class:`TrackingLost` rather than MLflow's error."""

    def __init__(self, client: Any, uri: str):
        self._client = client
        self._uri = uri

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            ensure_answers(self._uri)
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                if lost_to_its_disk(self._uri, exc):
                    raise _lost_error(self._uri) from exc
                if not is_remote(self._uri):
                    raise
                # Gone in the middle of this call (after MLflow's retries): lost from now on.
                why = unanswered(self._uri)
                if why is None:
                    raise
                mark_lost(self._uri, why)
                raise _lost_error(self._uri) from exc

        return call


def guarded(client: Any, uri: str) -> Any:
    """``client`` guarded: against a server gone, and against a full or read-only disk under a store."""
    return GuardedClient(client, uri)


@contextmanager
def guard(uri: str, where: str) -> Iterator[None]:
    """A block of a run's MLflow bookkeeping, at ``where`` (a stage's name), ended at its first
    call through a guarded client once the store is lost (a block that calls MLflow otherwise
    calls ``ensure_answers`` first). The loss is said once, in one line; the run goes on
    without tracking."""
    try:
        yield
    except TrackingLost:
        _say_lost(uri, where)
    except Exception as exc:
        # A block's own MLflow call outside the client (mlflow's fluent API, an artifact
        # written by hand) that hit a full or read-only disk loses the store as the client's would.
        if not lost_to_its_disk(uri, exc):
            raise
        _say_lost(uri, where)


def _say_lost(uri: str, where: str) -> None:
    with _lock:
        state = _lost.setdefault(uri, {"why": "", "where": where, "said": "", "full": "", "unwritable": ""})
        state["where"] = state["where"] or where
        if state["said"]:
            return
        state["said"] = "yes"
        why, first, snapshot = state["why"], state["where"], dict(state)
    if _local(snapshot):
        progress.say(f"tracking lost at {first}: {_local_text(uri, snapshot)}; the run goes on without tracking, "
                     "every stage's work is kept on disk")
        return
    progress.say(f"tracking lost at {first}: the MLflow server at {uri} stopped answering ({why}); the run goes on "
                 "without tracking, every stage's work is kept on disk")


def lost_line(uri: str) -> str:
    """The one line a run that lost its store ends with; "" when it did not."""
    with _lock:
        state = _lost.get(uri)
    if state is None:
        return ""
    where = f" at {state['where']}" if state["where"] else ""
    if _local(state):
        return (f"tracking lost{where}: {_local_text(uri, state)}; every stage's work is kept on disk and the rerun "
                "logs what is missing")
    return (f"tracking lost{where}: the MLflow server at {uri} stopped answering ({state['why']}); every stage's "
            f"work is kept on disk: start the server again ({START_SCRIPT}) and rerun the same command to log "
            "what is missing (no stage is redone)")
