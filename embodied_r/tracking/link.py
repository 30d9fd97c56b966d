"""This process's link to each MLflow store, every write in order through it. A server that stops
answering is ridden out: writes wait in the outbox (``outbox``) and go once it answers, a read
waits for it up to ``tracking.outage_s``; past that the store is lost for the run, said once. A
local store whose disk fills or turns read-only is lost at once."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

from embodied_r import progress
from embodied_r.tracking.config import DEFAULT_OUTAGE_S
from embodied_r.tracking.outbox import PENDING, Outbox, apply, resolved
from embodied_r.errors import TrackingLost
from embodied_r.tracking.store import START_SCRIPT, disk_loss, is_remote, lost_text, unanswered

log = logging.getLogger("embodied_r.tracking")

PROBE_S = 1.0
QUIET_S = 120.0  # a wait this short needs no words: the run's end says how long the server was away
# MLflow announces at INFO each new SQLite store's table creation and migration: the first
# lines a user sees of a run, about bookkeeping they did not ask for. Warnings still show.
_STORE_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")


def quiet_store_logs() -> None:
    for name in _STORE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    # It logs, with the SQL and a traceback, each database error it then raises: the error
    # itself reaches the caller (a full disk becomes the run's one line, ``guard``).
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


class Link:
    """This process's link to the store ``uri``: ``send`` a write, ``reads`` a client for
    reads; ``settle`` waits until every kept write is sent."""

    def __init__(self, uri: str):
        self.uri, self.remote = uri, is_remote(uri)
        self.lock = threading.RLock()
        self.bound_s = DEFAULT_OUTAGE_S
        self.lost: dict[str, str] | None = None
        self.away: float | None = None  # since when the server does not answer
        self.why = self.where = self.away_where = ""
        self.box = Outbox(uri) if self.remote else None
        self._client: Any = None
        self._probed = 0.0
        self._drainer: threading.Thread | None = None
        self._said_wait: float | None = None  # the outage whose wait was said

    def client(self) -> Any:
        if self._client is None:
            from mlflow import MlflowClient

            quiet_store_logs()
            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def opened(self, bound_s: float | None = None) -> None:
        """A run starts on a store that answers: nothing is lost or away any more; what earlier
        processes kept is sent now."""
        with self.lock:
            self.lost, self.away, self.where = None, None, ""
            if bound_s is not None:
                self.bound_s = bound_s
            if self.remote:
                self._drain_all()

    # -- writes ----------------------------------------------------------------------------

    def send(self, op: dict[str, Any]) -> str | None:
        """Send ``op``, or keep it while the server is away (a new run then goes by a pending
        id until it is sent); returns a new run's id."""
        op = {**op, "t": time.time()}
        if op["op"] == "create":
            op.setdefault("at", int(op["t"] * 1000))
        with self.lock:
            if self.lost and not self.remote:
                raise self.lost_error()
            if self.remote and self._behind():
                self._catch_up()
            if not (self.remote and self._behind()):
                ready = resolved(op, self.box.ids()) if self.remote else op
                try:
                    if ready is not None and (not self.remote or self._answers()):
                        return apply(self.client(), ready)
                except Exception as exc:
                    self._failed(exc)
            return self._keep(op)

    def _keep(self, op: dict[str, Any]) -> str | None:
        if op["op"] == "create":
            op["id"] = PENDING + uuid.uuid4().hex
        assert self.box is not None
        self.box.put(op)
        if self._drainer is None or not self._drainer.is_alive():
            self._drainer = threading.Thread(target=self._drain_loop, name="mlflow-outbox", daemon=True)
            self._drainer.start()
        return op.get("id")

    def _behind(self) -> bool:
        return self.away is not None or bool(self.box and self.box.pending())

    def _answers(self) -> bool:
        why = unanswered(self.uri)
        if why is None:
            return True
        self._went_away(why)
        return False

    def _went_away(self, why: str) -> None:
        if self.away is None:
            self.away, self.why, self.away_where = time.time(), why, self.where
            assert self.box is not None
            self.box.journal("away", why=why)

    def _failed(self, exc: Exception) -> None:
        """A write or read that failed: a server gone is away (the caller keeps or waits), a
        full or read-only disk under the store loses it, anything else is raised."""
        if lost_to_its_disk(self, exc):
            raise self.lost_error() from exc
        if not self.remote:
            raise exc
        why = unanswered(self.uri)
        if why is None:
            raise exc
        self._went_away(why)

    # -- sending what was kept -------------------------------------------------------------

    def _catch_up(self, force: bool = False) -> None:
        """Send what is kept when the server answers (asked at most every ``PROBE_S``)."""
        if not force and time.monotonic() - self._probed < PROBE_S:
            return
        self._probed = time.monotonic()
        if unanswered(self.uri) is not None:
            return
        if self._drain(self.box) and self.away is not None:
            self.away = None
            self.box.journal("back")

    def _drain(self, box: Outbox | None) -> bool:
        """Send ``box``'s writes in order; whether all went (a write that waits for the id of
        a run another process makes, or a server gone again, stops it)."""
        if box is None:
            return True
        done = None
        try:
            for index, op in box.pending():
                ready = resolved(op, box.ids())
                if ready is None:
                    return False
                try:
                    made = apply(self.client(), ready)
                except Exception as exc:  # noqa: BLE001 - sorted out below
                    if (why := unanswered(self.uri)) is not None:
                        self._went_away(why)
                        return False
                    # A write the store refuses now would stop every write after it for good.
                    log.warning("MLflow refused a kept write (%s of run %s): %s", op["op"], op.get("run", ""), exc)
                if op["op"] == "create" and made:
                    box.note_id(op["id"], made)
                done = index + 1
            return True
        finally:
            if done is not None:
                box.sent(done)

    def _drain_all(self) -> bool:
        """Send what this process and the ended ones kept, in passes while one sends something (an ended
        process's write may wait for a run id another makes); whether this process's own are all sent."""
        assert self.box is not None
        while self.away is None:
            moved = False
            for box in (self.box, *self.box.orphans()):
                before = len(box.pending())
                self._drain(box)
                moved = moved or len(box.pending()) < before
            if not moved:
                break
        return self.away is None and not self.box.pending()

    def _drain_loop(self) -> None:
        while True:
            time.sleep(PROBE_S)
            with self.lock:
                if unanswered(self.uri) is None:
                    self._catch_up(force=True)
                    if not self._behind():
                        self._drain_all()
                        return

    def settle(self) -> None:
        """Wait until every write this store's processes kept is sent (up to the bound)."""
        if not self.remote:
            return
        with self.lock:
            self._wait(lambda: self._drain_all() and not self._behind())

    def drain_orphans(self) -> None:
        """Send what ended processes kept (a trainer child's steps), when the server answers."""
        if self.remote:
            with self.lock:
                if not self.lost and unanswered(self.uri) is None:
                    self._drain_all()

    # -- reads -----------------------------------------------------------------------------

    def ready(self) -> None:
        """Return once the store answers with every write of this process sent; raise
        :class:`TrackingLost` when it is lost, or stays away past the bound."""
        with self.lock:
            if self.lost:
                raise self.lost_error()
            if self.remote and (self._behind() or not self._answers()):
                self._wait(lambda: not self._behind())

    def _wait(self, done: Any) -> None:
        if self.lost:
            raise self.lost_error()
        start = time.time()
        deadline = (self.away or start) + self.bound_s
        while True:
            self._catch_up(force=True)
            if done():
                return
            now = time.time()
            if now >= deadline:
                self.lose()
                raise self.lost_error()
            if self._said_wait != self.away and now - start >= QUIET_S:
                self._said_wait = self.away
                progress.say(f"tracking: the MLflow server at {self.uri} does not answer ({self.why}); waiting up to "
                             f"{deadline - now:.0f} s more for it, every stage's work goes on")
            time.sleep(PROBE_S)

    def real(self, run_id: str) -> str:
        """The store's own id of a run made while it was away, once sent; ``run_id`` otherwise."""
        return self.box.ids().get(run_id, run_id) if self.box else run_id

    def reads(self) -> Any:
        """The store's client, each call made once the store is ready (``ready``)."""
        return _Reads(self)

    # -- lost ------------------------------------------------------------------------------

    def lose(self, why: str = "", full: str = "", unwritable: str = "") -> None:
        with self.lock:
            if self.lost is None:
                self.lost = {"why": why or self.why, "where": self.away_where or self.where, "said": "",
                             "full": full, "unwritable": unwritable}

    def lost_error(self) -> TrackingLost:
        state = self.lost or {}
        if state.get("full") or state.get("unwritable"):
            return TrackingLost(f"tracking lost: {lost_text(self.uri, state)}")
        return TrackingLost(f"tracking lost: the MLflow server at {self.uri} stopped answering ({state.get('why', '')})")


class _Reads:
    def __init__(self, link: Link):
        self._link = link

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._link.client(), name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args: Any, **kwargs: Any) -> Any:
            self._link.ready()
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                with self._link.lock:
                    self._link._failed(exc)  # gone in the middle of this call: wait, then once more
                self._link.ready()
                return attr(*args, **kwargs)

        return call


_links: dict[str, Link] = {}
_links_lock = threading.Lock()


def link(uri: str) -> Link:
    with _links_lock:
        return _links.setdefault(uri, Link(uri))


def tracking_lost(uri: str) -> bool:
    return link(uri).lost is not None


def lost_to_its_disk(store: Link, exc: BaseException) -> bool:
    """Lose ``store`` when ``exc`` is its disk filling or turning read-only (``disk_loss``)."""
    found = disk_loss(store.uri, exc)
    if found is not None:
        store.lose(**found)
    return found is not None


@contextmanager
def guard(uri: str, where: str) -> Iterator[None]:
    """A block of a run's MLflow bookkeeping, at ``where`` (a stage's name), ended once the
    store is lost; the loss is said once, in one line, and the run goes on without tracking."""
    store = link(uri)
    store.where = where
    try:
        yield
    except TrackingLost:
        _say_lost(store)
    except Exception as exc:
        # A block's own MLflow call outside the link (mlflow's fluent API, an artifact written
        # by hand) that hit a full or read-only disk loses the store as the link's would.
        if not lost_to_its_disk(store, exc):
            raise
        _say_lost(store)


def _kept(store: Link) -> str:
    return f"what it would have logged is kept in {store.box.folder}" if store.box else ""


def _say_lost(store: Link) -> None:
    store.lose()
    with store.lock:
        state = store.lost or {}
        if state["said"]:
            return
        state["said"] = "yes"
    uri, first = store.uri, state["where"] or store.where
    if state.get("full") or state.get("unwritable"):
        progress.say(f"tracking lost at {first}: {lost_text(uri, state)}; the run goes on without tracking, "
                     "every stage's work is kept on disk")
        return
    progress.say(f"tracking lost at {first}: the MLflow server at {uri} stopped answering ({state['why']}) and did "
                 f"not answer within {store.bound_s:g} s; the run goes on without tracking, every stage's work is "
                 f"kept on disk and {_kept(store)}")


def lost_line(uri: str) -> str:
    """The one line a run that lost its store ends with; "" when it did not."""
    store = link(uri)
    state = store.lost
    if state is None:
        return ""
    where = f" at {state['where']}" if state["where"] else ""
    if state.get("full") or state.get("unwritable"):
        return (f"tracking lost{where}: {lost_text(uri, state)}; every stage's work is kept on disk and the rerun "
                "logs what is missing")
    return (f"tracking lost{where}: the MLflow server at {uri} stopped answering ({state['why']}); every stage's "
            f"work is kept on disk and {_kept(store)}: start the server again ({START_SCRIPT}) and rerun the same "
            "command to log what is missing (no stage is redone)")


def outage_line(uri: str, since: float) -> str:
    """The one line of a run whose server was away and came back: for how long, and that every
    value was sent (or where what is left waits for the next run)."""
    store = link(uri)
    seconds = store.box.away_seconds(since) if store.box and not store.lost else 0.0
    if not seconds:
        return ""
    away = f"tracking: the MLflow server at {uri} was away for {seconds:.0f} s"
    if any(b.pending() for b in (store.box, *store.box.orphans())):
        return f"{away}; what it did not get yet is kept in {store.box.folder} and the next run sends it"
    return f"{away}; every value was sent once it answered"
