"""File conventions shared by every stage: a stage writes into ``<final>.partial`` and renames it
to ``<final>`` when done, so a folder under its final name is complete; per-item stages keep an
append-only log of finished items there (with the kill tests' stall hook), so a rerun resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

if TYPE_CHECKING:
    import pyarrow as pa

from embodied_r.errors import DataSourceError, StageBusy, WriteFailure

# A folder key: the first 16 hex digits (64 bits) of a sha256, plenty to tell apart the
# folders of one parent and short enough to read in a path.
KEY_HEX = 16


def text_key(text: str | bytes) -> str:
    """The folder key of a text or bytes: its sha256, cut to ``KEY_HEX`` digits."""
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:KEY_HEX]


def payload_key(payload: Any) -> str:
    """The folder key of a JSON-able payload, by its canonical JSON (sorted keys; a value JSON
    cannot hold, such as a path, as its ``str``), so equal payloads share a folder whatever
    their key order."""
    return text_key(json.dumps(payload, sort_keys=True, default=str))


def keyed_folder(parent: Path, payload: Any) -> Path:
    """``<parent>/<payload_key(payload)>``: a folder named by what is in it."""
    return Path(parent) / payload_key(payload)


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


def is_complete(final: Path) -> bool:
    return final.is_dir() and (final / "summary.json").is_file()


# "wait" (default): a second run on the same stage waits, saying so; "fail": it stops at once.
LOCK_ENV = "EMBODIED_R_LOCK"


@contextmanager
def stage_lock(final: Path) -> Iterator[None]:
    """An exclusive lock on stage ``final`` for this process, so no two runs share its ``.partial``
    folder; the kernel drops ``flock`` when its holder dies, even by kill -9: no lock is left stale."""
    import fcntl

    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.with_name(final.name + ".lock"), "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            where = f"{final.parent.name}/{final.name}"
            if os.environ.get(LOCK_ENV, "wait") == "fail":
                raise StageBusy(f"stage {where} is being run by another process (lock {fh.name}); "
                                "wait for it to end, or run again without --no-wait to queue behind it") from None
            print(f"stage {where} is being run by another process; waiting for it to finish...",
                  file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def stage_folder(final: Path) -> Iterator[Path]:
    """Yield the partial folder of ``final`` (reused across attempts, left when the body raises)
    and rename it into place on success, under the stage's lock."""
    final = Path(final)
    work = partial_path(final)
    with stage_lock(final):
        work.mkdir(parents=True, exist_ok=True)
        yield work
        if is_complete(final):
            # A run we waited for finished first; its output is equivalent.
            shutil.rmtree(work, ignore_errors=True)
            return
        if final.is_dir() and not any(final.iterdir()):
            final.rmdir()  # a folder made ahead of time (``mkdir out`` before ``--out out``)
        elif final.exists():
            raise FileExistsError(f"{final} exists and holds files that are not a finished stage's output: "
                                  f"move them away or choose another folder (the finished work is in {work})")
        os.replace(work, final)


def write_text_atomic(path: Path, text: str | Iterable[str]) -> None:
    """``text`` (or its pieces in turn) in ``path``, whole or not at all: written aside, synced,
    then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for piece in [text] if isinstance(text, str) else text:  # a str is one piece, not its characters
            fh.write(piece)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str))


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write_parquet_atomic(table: "pa.Table", path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    import pyarrow.parquet as pq

    pq.write_table(table, tmp)
    os.replace(tmp, path)


SUMMARY_FILE = "summary.json"
# The summary's record of what the finished folder holds (``output_manifest``).
OUTPUTS_KEY = "outputs"


def write_summary(folder: Path, summary: dict[str, Any]) -> None:
    """The summary is written last: its presence marks a stage folder complete. It records
    what the folder holds then (``OUTPUTS_KEY``, set in ``summary`` too, so the summary a
    stage returns is the one a rerun reads), so a file lost since is found."""
    folder = Path(folder)
    summary[OUTPUTS_KEY] = output_manifest(folder)
    write_json_atomic(folder / SUMMARY_FILE, summary)


def read_summary(folder: Path) -> dict[str, Any]:
    return read_json(Path(folder) / SUMMARY_FILE)


def _entry(path: Path) -> dict[str, int]:
    """One manifest entry: a file's size (a Parquet file's row count too), or a folder's file
    count and total size (its files are not listed one by one: key frames count thousands)."""
    if path.is_dir():
        sizes = [p.stat().st_size for p in path.rglob("*") if p.is_file()]
        return {"files": len(sizes), "bytes": sum(sizes)}
    entry = {"bytes": path.stat().st_size}
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        entry["rows"] = pq.read_metadata(path).num_rows
    return entry


def output_manifest(folder: Path) -> dict[str, dict[str, int]]:
    """What ``folder`` holds besides its summary: each file by name, each sub-folder as
    ``name/``."""
    return {p.name + ("/" if p.is_dir() else ""): _entry(p) for p in sorted(Path(folder).iterdir())
            if p.name != SUMMARY_FILE and not p.name.startswith(".") and (p.is_dir() or p.is_file())}


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def damaged_outputs(folder: Path) -> list[str]:
    """What a finished folder lost since its stage finished, one phrase an entry: missing,
    another size, another row count, a Parquet file that no longer reads. A folder finished
    before sizes were recorded has nothing to compare: it is taken as it is."""
    recorded = read_summary(folder).get(OUTPUTS_KEY)
    if not isinstance(recorded, dict):
        return []
    problems = []
    for name, then in recorded.items():
        path = Path(folder) / name.rstrip("/")
        if not (path.is_dir() if name.endswith("/") else path.is_file()):
            problems.append(f"{name} is missing")
        elif name.endswith("/"):
            now = _entry(path)
            if now != then:
                problems.append(f"{name} holds {_count(now['files'], 'file')} of {_count(now['bytes'], 'byte')}, "
                                f"not {then.get('files')} of {then.get('bytes')}")
        elif (size := path.stat().st_size) != then.get("bytes"):
            problems.append(f"{name} has {_count(size, 'byte')}, not {then.get('bytes')}")
        elif "rows" in then:
            try:
                import pyarrow.parquet as pq

                rows = pq.read_metadata(path).num_rows
            except Exception as exc:  # noqa: BLE001 - a footer that no longer reads, whatever pyarrow raises
                problems.append(f"{name} cannot be read as Parquet ({' '.join(str(exc).split())[:80]})")
                continue
            if rows != then["rows"]:
                problems.append(f"{name} holds {_count(rows, 'row')}, not {then['rows']}")
    return problems


def update_outputs(folder: Path, changed: Iterable[Path]) -> None:
    """Record again the entries of a finished folder that hold ``changed`` paths (files
    rewritten on purpose, such as a relocated home's paths), leaving the others as recorded."""
    folder = Path(folder)
    summary = read_summary(folder)
    recorded = summary.get(OUTPUTS_KEY)
    if not isinstance(recorded, dict):
        return
    for path in changed:
        top = folder / Path(path).relative_to(folder).parts[0]
        name = top.name + ("/" if top.is_dir() else "")
        if name in recorded:
            recorded[name] = _entry(top)
    write_json_atomic(folder / SUMMARY_FILE, summary)


STALL_ENV = "EMBODIED_R_STALL_AT"
STALL_MARKER_ENV = "EMBODIED_R_STALL_MARKER"
_stall_counts: dict[str, int] = {}
_stall_lock = threading.Lock()


def item_done(stage: str) -> None:
    """An item boundary of ``stage``: with ``EMBODIED_R_STALL_AT=<stage>:<n>`` (kill tests) its n-th
    item in this process creates ``$EMBODIED_R_STALL_MARKER`` (when set) and sleeps an hour for the
    test to kill it there, other threads waiting behind; unset, it is one environment lookup."""
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
        if marker := os.environ.get(STALL_MARKER_ENV):
            with open(marker, "w", encoding="utf-8") as fh:
                fh.write(f"{stage}:{count} {os.getpid()}\n")
        print(f"{STALL_ENV}: {stage} stalled after item {count}", file=sys.stderr, flush=True)
        time.sleep(3600)


class ItemLog:
    """Append-only JSON-lines record of finished items, one flushed ``write`` per item; a torn last
    line (a kill mid-write) is ignored on reading, so that item is done again."""

    def __init__(self, path: Path, key: str = "id",
                 validate: Callable[[dict[str, Any]], bool] | None = None):
        self.path = Path(path)
        self.key = key
        # Checks each replayed entry against the stage's schema: an entry written by an
        # older or buggy run is dropped (and its item done again) instead of breaking
        # every resume that replays it.
        self.validate = validate
        self.dropped = 0
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        records: dict[str, dict[str, Any]] = {}
        self.dropped = 0
        with open(self.path, encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    self.dropped += 1
                    continue
                if not isinstance(rec, dict) or self.key not in rec or (
                        self.validate is not None and not self._valid(rec)):
                    self.dropped += 1
                    continue
                records[str(rec[self.key])] = rec
        return list(records.values())

    def _valid(self, rec: dict[str, Any]) -> bool:
        try:
            return bool(self.validate(rec))  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - a validator tripping over a bad entry rejects it
            return False

    def done_ids(self) -> set[str]:
        return {str(r[self.key]) for r in self.read()}

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        with self._lock:
            try:
                self._repair_tail()
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(line)
                    fh.flush()
                    os.fsync(fh.fileno())
            except OSError as exc:
                # A torn line is dropped on reading, so every item logged before is kept.
                raise WriteFailure(
                    f"cannot write {self.path} ({exc.strerror or exc}): free space on that disk (or make "
                    "it writable) and run again; every item finished before is kept") from exc

    def _repair_tail(self) -> None:
        """Drop a torn last line so the next record starts on a line of its own."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) == b"\n":
                return
            fh.seek(0)
            data = fh.read()
            cut = data.rfind(b"\n") + 1
            fh.truncate(cut)


def table_from_records(records: list[dict[str, Any]], schema: "pa.Schema") -> "pa.Table":
    import pyarrow as pa

    cols = {name: [r.get(name) for r in records] for name in schema.names}
    return pa.table(cols, schema=schema)


def sha256_file(path: Path, block: int = 1 << 20) -> str:
    """sha256 of a file read in blocks, so memory stays flat however large the file."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            h.update(chunk)
    return h.hexdigest()


def safe_extract(archive: Path, dest: Path, max_bytes: int, stage: str = "download",
                 names: set[str] | None = None) -> int:
    """Extract a zip (only entries whose lower-case file name is in ``names``, None: all), refusing
    absolute paths, ``..``, links and expansion past ``max_bytes``; an entry already there with
    the right size is skipped. Returns the files written, each an item boundary of ``stage``."""
    dest = Path(dest).resolve()
    try:
        return _extract(archive, dest, max_bytes, stage, names)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError) as exc:
        # A file that is not a zip, or one whose entry fails its CRC: name the archive.
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise DataSourceError(f"{archive}: damaged or not a zip archive ({detail}); download it again") from None


def _extract(archive: Path, dest: Path, max_bytes: int, stage: str, names: set[str] | None) -> int:
    written = 0
    with zipfile.ZipFile(archive) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()
                 and (names is None or PurePosixPath(i.filename).name.lower() in names)]
        total = sum(i.file_size for i in infos)
        if total > max_bytes:
            raise DataSourceError(f"{archive}: expands to {total} bytes, over the bound {max_bytes}")
        for info in infos:
            name = info.filename
            mode = (info.external_attr >> 16) & 0o170000
            if mode == 0o120000:
                raise DataSourceError(f"{archive}: entry {name!r} is a link; refusing to extract")
            target = (dest / name).resolve()
            if Path(name).is_absolute() or ".." in Path(name).parts or dest not in target.parents:
                raise DataSourceError(f"{archive}: entry {name!r} escapes the target folder")
            if target.exists() and target.stat().st_size == info.file_size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            with zf.open(info) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, target)
            written += 1
            item_done(stage)
    return written
