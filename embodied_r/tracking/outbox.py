"""The writes a process sends to an MLflow store (``apply``), and those it keeps while the server
is away, in the home: one file per process, in order, with copies of the files they log, the
ids of runs made while away, and when each process found the server away and back."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from embodied_r.paths import home

FOLDER = "mlflow-outbox"
# The id a run made while the server was away goes by until the server gives it its own.
PENDING = "pending-"
_IDS, _JOURNAL = "ids.json", "outages.jsonl"


def start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux); None when it is gone.
    With the pid, it names a process even after its pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_name(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{start_ticks(pid) or ''}"


def gone(owner: str) -> bool:
    """Whether the process ``owner`` (``process_name``) has ended; one of another host never is."""
    parts = owner.split(":")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    alive = start_ticks(int(parts[1]))
    return alive is None or bool(parts[2]) and alive != parts[2]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Outbox:
    """The writes one process keeps for the store ``uri`` (``ops-<process>.jsonl``), sent in
    order: ``pending`` what is still to send, ``sent`` how far it got."""

    def __init__(self, uri: str, path: Path | None = None):
        self.uri, self._path = uri, path

    @property
    def folder(self) -> Path:
        """In the home of the run now (one process may run pipelines of several homes)."""
        return self._path.parent if self._path else home() / FOLDER / hashlib.sha1(self.uri.encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        return self._path or self.folder / f"ops-{process_name().replace(':', '-')}.jsonl"

    @property
    def owner(self) -> str:
        # host-pid-ticks: a host's name may hold dashes, the others do not.
        return ":".join(self.path.stem[len("ops-"):].rsplit("-", 2))

    @property
    def _cursor(self) -> Path:
        return self.path.with_suffix(".sent")

    def put(self, op: dict[str, Any]) -> None:
        """Keep ``op``; a file it logs is copied first, as it is now."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with _locked(self.path):
            if "path" in op:
                copy = self.path.with_suffix("") / f"{time.time_ns()}" / Path(op["path"]).name
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(op["path"], copy)
                op = {**op, "path": str(copy)}
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(op) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def _done(self) -> int:
        try:
            return int(self._cursor.read_text())
        except (OSError, ValueError):
            return 0

    def pending(self) -> list[tuple[int, dict[str, Any]]]:
        if not self.path.is_file():
            return []
        with _locked(self.path):
            lines = self.path.read_text(encoding="utf-8").splitlines()
        done = self._done()
        # A line cut short by a process killed while writing it is no write.
        return [(i, json.loads(line)) for i, line in enumerate(lines) if i >= done and line.endswith("}")]

    def sent(self, upto: int) -> None:
        """``upto`` writes are sent; a file all sent is removed with its copies."""
        with _locked(self.path):
            total = len(self.path.read_text(encoding="utf-8").splitlines()) if self.path.is_file() else 0
            if upto < total:
                tmp = self._cursor.with_suffix(".tmp")
                tmp.write_text(str(upto))
                os.replace(tmp, self._cursor)
                return
            for path in (self.path, self._cursor):
                path.unlink(missing_ok=True)
            shutil.rmtree(self.path.with_suffix(""), ignore_errors=True)

    def orphans(self) -> list["Outbox"]:
        """The outboxes of this store's processes that have ended, oldest write first."""
        if not self.folder.is_dir():
            return []
        boxes = [Outbox(self.uri, p) for p in self.folder.glob("ops-*.jsonl") if p != self.path]
        boxes = [b for b in boxes if gone(b.owner)]
        return sorted(boxes, key=lambda b: (b.pending() or [(0, {"t": 0})])[0][1].get("t", 0))

    def ids(self) -> dict[str, str]:
        """The store's ids of the runs made while it was away, by the id they went by."""
        try:
            return json.loads((self.folder / _IDS).read_text())
        except (OSError, ValueError):
            return {}

    def note_id(self, pending: str, run_id: str) -> None:
        path = self.folder / _IDS
        with _locked(path):
            ids = {**self.ids(), pending: run_id}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(ids))
            os.replace(tmp, path)

    def journal(self, event: str, **fields: Any) -> None:
        """``away`` or ``back``: when this process found the server gone, or answering again."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / _JOURNAL, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({event: time.time(), "process": self.owner, **fields}) + "\n")

    def away_seconds(self, since: float) -> float:
        """How long, since ``since``, some process of this store found its server away: an
        outage ends where a process next found the server answering."""
        try:
            lines = (self.folder / _JOURNAL).read_text(encoding="utf-8").splitlines()
        except OSError:
            return 0.0
        events = [e for e in map(json.loads, lines) if max(e.get("away", 0), e.get("back", 0)) >= since]
        backs = sorted(e["back"] for e in events if "back" in e)
        spans = sorted((e["away"], next((b for b in backs if b >= e["away"]), time.time()))
                       for e in events if "away" in e)
        total, reach = 0.0, 0.0
        for start, end in spans:
            start = max(start, reach)
            if end > start:
                total, reach = total + end - start, end
        return total


def apply(client: Any, op: dict[str, Any]) -> str | None:
    """Send one write (``Tracker`` makes them) to the store; a new run's id for ``create``."""
    from mlflow.entities import Metric, Param, RunTag

    kind, run = op["op"], op.get("run", "")
    if kind == "create":
        return client.create_run(op["experiment"], start_time=op["at"], tags=op["tags"],
                                 run_name=op["name"]).info.run_id
    if kind == "batch":
        client.log_batch(run, metrics=[Metric(*m) for m in op.get("metrics", [])],
                         params=[Param(*p) for p in op.get("params", [])], tags=[RunTag(*t) for t in op.get("tags", [])])
    elif kind in ("artifact", "table"):
        client.log_artifact(run, op["path"])
        if kind == "table":
            # The UI shows a JSON file as a table once the run's tag lists it.
            logged = json.loads(client.get_run(run).data.tags.get("mlflow.loggedArtifacts", "[]"))
            entry = {"path": op["name"], "type": "table"}
            if entry not in logged:
                client.set_tag(run, "mlflow.loggedArtifacts", json.dumps([*logged, entry]))
    elif kind == "end":
        client.set_terminated(run, status=op["status"], end_time=op["at"])
    elif kind == "rename":
        client.update_run(run, name=op["name"])
    return None


def _ids_in(op: dict[str, Any]) -> list[str]:
    return [v for v in (op.get("run"), *op.get("tags", {}).values()) if isinstance(v, str) and v.startswith(PENDING)] \
        if op["op"] == "create" else [op["run"]] if str(op.get("run", "")).startswith(PENDING) else []


def resolved(op: dict[str, Any], ids: dict[str, str]) -> dict[str, Any] | None:
    """``op`` with the store's ids for runs made while away; None while one is not known yet."""
    if any(i not in ids for i in _ids_in(op)):
        return None
    if op["op"] == "create":
        return {**op, "tags": {k: ids.get(v, v) if isinstance(v, str) else v for k, v in op["tags"].items()}}
    return {**op, "run": ids.get(op.get("run", ""), op.get("run"))}
