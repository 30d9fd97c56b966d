"""Where the project keeps its files (models, stage outputs, the MLflow store, Prefect results),
and how a path that cannot be written or a full disk is said."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

from embodied_r.errors import HomeMovedError, HomeUnusable, causes, disk_full

# Written into a home on first use: where it was then. Stage outputs and the MLflow store
# record absolute paths (the catalog's video paths, artifact locations), so a home that has
# been copied or moved must have them rewritten before it is used again.
HOME_MARKER = ".embodied-r-home.json"
# Held while a run does what two runs must not do at once in one home (creating the MLflow
# store: two processes migrating a fresh SQLite file break each other).
HOME_LOCK = ".embodied-r-home.lock"


# errno values that say a folder cannot take what is written into it, whoever writes (root
# included): a read-only file system, no permission, a file where a folder belongs (EEXIST when
# that file is the folder being made).
_REFUSED = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST}


FILE_IN_THE_WAY = "is a file where a folder belongs"
# What a path that cannot be written is, in the words every such line uses (also ``tracking.store``).
READ_ONLY = "is on a read-only file system"
NOT_PERMITTED = "is refused to this user by its permissions"


def fs_fault(exc: OSError) -> tuple[Path | None, str]:
    """What is wrong, in words, and the path it is wrong with: the file that stands where a
    folder belongs (not the path below it the call named), the folder that cannot be written
    (not a file that was never made in it)."""
    named = exc.filename if isinstance(exc.filename, (str, os.PathLike)) else None
    path = Path(named) if named else None
    code = exc.errno
    if path is not None and code in (errno.ENOTDIR, errno.EEXIST):
        blocking = next((p for p in (*reversed(path.parents), path) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            return blocking, FILE_IN_THE_WAY
    if path is not None and (code in (errno.EACCES, errno.EPERM) and not path.exists()
                             or code == errno.EROFS and not path.is_dir()):
        path = path.parent  # what cannot be written is the folder (a whole read-only file system)
    why = {errno.EROFS: READ_ONLY, errno.EACCES: NOT_PERMITTED,
           errno.EPERM: NOT_PERMITTED, errno.EISDIR: "is a folder where a file belongs",
           errno.ENOENT: "does not exist", errno.ENOSPC: "is on a full disk", errno.EDQUOT: "is over its disk quota",
           }.get(code or 0, (exc.strerror or str(exc) or type(exc).__name__).lower())
    return path, why


def refused(exc: BaseException | None) -> OSError | None:
    """The first error along ``exc``'s chain that says a path cannot be used as asked
    (``_REFUSED``), or None."""
    def says(e: BaseException) -> bool:
        if not isinstance(e, OSError) or e.errno not in _REFUSED:
            return False
        # A folder that already exists (mkdir without exist_ok) is no refusal, a file in its place is.
        return e.errno != errno.EEXIST or (e.filename is not None and not Path(e.filename).is_dir())

    return next((e for e in causes(exc) if says(e)), None)


def in_home(path: str | os.PathLike[str] | None, root: Path | None = None) -> bool:
    if not path:
        return False
    root = Path(root or home())
    target = Path(os.path.abspath(path))
    return target == root or root in target.parents


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


def home_line(root: Path, exc: OSError, doing: str = "written") -> str:
    """The one line for a project home (or a folder under it) that cannot be used: the home as
    the home, the path and what is wrong with it, and the fix."""
    if disk_full(exc):
        return disk_full_line(f"the project home {root}", root)
    path, why = fs_fault(exc)
    fix = "Move that file away" if why == FILE_IN_THE_WAY else "Make it writable"
    return (f"the project home {root} (EMBODIED_R_HOME) cannot be {doing}: {path or root} {why}. {fix}, or set "
            "EMBODIED_R_HOME, or pass --home, to a folder you can write (it is made when missing; to keep this "
            "home's finished work there, copy it and run `embodied-r relocate --home <the copy>`)")


def _unusable(root: Path, doing: str, exc: OSError) -> HomeUnusable:
    return HomeUnusable(home_line(root, exc, doing))


def home() -> Path:
    """``$EMBODIED_R_HOME``, else ``~/.embodied-r``. May be a shared filesystem when
    work pools run on different machines."""
    return Path(os.environ.get("EMBODIED_R_HOME") or Path.home() / ".embodied-r").expanduser().resolve()


def default_tracking_uri(root: Path | None = None) -> str:
    return f"sqlite:///{(root or home()) / 'mlflow.db'}"


def artifacts_root(root: Path | None = None) -> Path:
    return (root or home()) / "mlartifacts"


def prefect_results(root: Path | None = None) -> Path:
    return (root or home()) / "prefect-results"


def claim_home(root: Path | None = None) -> Path:
    """Record where the home lives on first use; refuse one that has moved since."""
    root = Path(root or home())
    marker = root / HOME_MARKER
    try:
        text = marker.read_text()
    except FileNotFoundError:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unusable(root, "created", exc) from exc
        _write_marker(root, marker)
        return root
    except NotADirectoryError as exc:  # a file where the home or a folder above it should be
        raise _unusable(root, "created", exc) from exc
    except OSError as exc:  # a folder we may not read
        raise _unusable(root, "read", exc) from exc
    try:
        recorded = json.loads(text)["path"]
        if not isinstance(recorded, str):
            raise TypeError("path is not text")
    except (ValueError, KeyError, TypeError) as exc:
        # Where the home was made is unknown: only the user knows whether it moved since.
        raise HomeUnusable(
            f"the project home {root} (EMBODIED_R_HOME) has a damaged {marker} (not the JSON it writes, "
            '{"path": "<where the home was made>"}): if the home was made here, delete that file (the next '
            f"command writes it again); if it was copied from elsewhere, write that path into it and run "
            f"`embodied-r relocate --home {root}`") from exc
    # Every stage writes under the home: a read-only one is said now, as the home, not as
    # the first stage's failure to write some file deep inside it.
    _write_marker(root, marker, probe=True)
    if Path(recorded) != root:
        raise HomeMovedError(
            f"the project home {root} was created at {recorded}; the paths it records still point "
            f"there. Run `embodied-r relocate --home {root}` to rewrite them, or use it at {recorded}"
        )
    return root


def _write_marker(root: Path, marker: Path, probe: bool = False) -> None:
    tmp = marker.with_name(f".{marker.name}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(json.dumps({"path": str(root)}))
        if probe:
            tmp.unlink()
        else:
            os.replace(tmp, marker)
    except OSError as exc:
        # On a read-only file system even removing a file that is not there fails (EROFS).
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise _unusable(root, "written", exc) from exc


@contextmanager
def home_lock(root: Path | None = None, what: str = "set up the project home") -> Iterator[None]:
    """An exclusive lock on the home; a second run waits for it, saying so. ``flock`` is
    dropped by the kernel when its holder dies, even by kill -9."""
    import fcntl

    root = Path(root or home())
    root.mkdir(parents=True, exist_ok=True)
    with open(root / HOME_LOCK, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"another run is about to {what} in {root}; waiting for it...", file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
