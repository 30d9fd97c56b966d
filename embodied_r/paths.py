"""Where the project keeps its files: models, stage outputs, the MLflow store, Prefect results."""

from __future__ import annotations

import json
import os
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# Written into a home on first use: where it was then. Stage outputs and the MLflow store
# record absolute paths (the catalog's video paths, artifact locations), so a home that has
# been copied or moved must have them rewritten before it is used again.
HOME_MARKER = ".embodied-r-home.json"
# Held while a run does what two runs must not do at once in one home (creating the MLflow
# store: two processes migrating a fresh SQLite file break each other).
HOME_LOCK = ".embodied-r-home.lock"


class HomeMovedError(RuntimeError):
    """The home was created elsewhere; the message says how to relocate it."""


class HomeUnusable(RuntimeError):
    """The project home cannot be created or written; the message names it as the home."""


def _unusable(root: Path, doing: str, exc: OSError) -> HomeUnusable:
    from embodied_r.faults import disk_full, disk_full_line

    if disk_full(exc):
        return HomeUnusable(disk_full_line(f"the project home {root}", root))
    why = exc.strerror or type(exc).__name__
    where = f" at {exc.filename}" if exc.filename and str(exc.filename) != str(root) else ""
    return HomeUnusable(
        f"the project home {root} (EMBODIED_R_HOME) cannot be {doing} ({why}{where}): set EMBODIED_R_HOME, or "
        "pass --home, to a folder you can write (it is made when missing), or make that one writable")


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
        recorded = json.loads(marker.read_text())["path"]
    except FileNotFoundError:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unusable(root, "created", exc) from None
        _write_marker(root, marker)
        return root
    except NotADirectoryError as exc:  # a file where the home or a folder above it should be
        raise _unusable(root, "created", exc) from None
    except OSError as exc:  # a folder we may not read
        raise _unusable(root, "read", exc) from None
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
        tmp.unlink(missing_ok=True)
        raise _unusable(root, "written", exc) from None


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
