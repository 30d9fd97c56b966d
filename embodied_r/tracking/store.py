"""The MLflow store a run names: where its URI came from, whether it can be opened, whether its
server answers, and the one line that says why not, with the fix."""

from __future__ import annotations

import os
import time
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from embodied_r.errors import TrackingUnavailable, causes, disk_full, full_path
from embodied_r.paths import NOT_PERMITTED, READ_ONLY, default_tracking_uri, disk_full_line, fs_fault, refused

_lock = threading.Lock()
# Long enough for a busy server to answer its health check, short enough to say at once
# that nothing does.
CHECK_TIMEOUT_S = 5.0
START_SCRIPT = "infra/start-mlflow.sh"
# A proxy's own answers that say the server behind it is gone.
_GONE_STATUSES = (502, 503, 504)




def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


# Where a store's URI came from, noted where it is resolved (``tracking_uri``): a flow runs with
# MLFLOW_TRACKING_URI set to the URI it resolved, so the environment read later would name that
# variable for every store.
RECIPE, ENVIRONMENT, HOME = "tracking.tracking_uri", "MLFLOW_TRACKING_URI", "EMBODIED_R_HOME"
_origins: dict[str, str] = {}


def note_origin(uri: str, origin: str) -> str:
    """Record where ``uri`` came from (the first word stands); returns ``uri``."""
    with _lock:
        _origins.setdefault(uri, origin)
    return uri


def noted() -> list[str]:
    """The stores this process resolved, the latest first: an error that names no URI of its own
    is about one of them."""
    with _lock:
        return list(reversed(_origins))


def tracking_uri(configured: str | None = None, root: Path | None = None) -> str:
    """The recipe's store, else MLFLOW_TRACKING_URI's, else the home's; noted whence."""
    if configured:
        return note_origin(configured, RECIPE)
    if env := os.environ.get("MLFLOW_TRACKING_URI"):
        return note_origin(env, HOME if env == default_tracking_uri(root) else ENVIRONMENT)
    return note_origin(default_tracking_uri(root), HOME)


def origin(uri: str) -> str:
    with _lock:
        noted = _origins.get(uri)
    if noted:
        return noted
    if os.environ.get("MLFLOW_TRACKING_URI") == uri:
        return ENVIRONMENT
    return HOME if uri == default_tracking_uri() else RECIPE


def named(uri: str) -> str:
    return {RECIPE: f"the MLflow tracking store {uri} (the recipe's tracking.tracking_uri)",
            ENVIRONMENT: f"the MLflow tracking store {uri} (from MLFLOW_TRACKING_URI)",
            HOME: f"the MLflow tracking store {uri} (the project home's own, EMBODIED_R_HOME)"}[origin(uri)]


def _setting(uri: str) -> str:
    return {RECIPE: "tracking.tracking_uri", ENVIRONMENT: "MLFLOW_TRACKING_URI", HOME: "the store"}[origin(uri)]


def or_the_local_store(uri: str) -> str:
    """The other way out: the local SQLite store in the project home ("" for that store itself)."""
    return {RECIPE: ", or remove tracking.tracking_uri from the recipe to use the local SQLite store in the "
                    "project home",
            ENVIRONMENT: ", or leave MLFLOW_TRACKING_URI unset to use the local SQLite store in the project home",
            HOME: ""}[origin(uri)]


# The schemes MLflow 3 opens a tracking store for (its tracking store registry), and the
# SQLAlchemy ones among them, with the package that brings each driver MLflow's URIs load.
SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "databricks-uc", "uc")
_DATABASES = ("postgresql", "mysql", "mssql")
_DRIVER_PACKAGES = {"psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient", "pymysql": "PyMySQL",
                    "pyodbc": "pyodbc", "psycopg": "psycopg[binary]", "mysql": "mysql-connector-python"}
_SQLITE_HEADER = b"SQLite format 3\x00"


def unwritable_why(folder: Path) -> str:
    """Why ``folder`` cannot take new files ("" when it can): SQLite writes its journal beside
    the database."""
    if os.access(folder, os.W_OK | os.X_OK):
        return ""
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return READ_ONLY if read_only else NOT_PERMITTED


def _sqlite_problem(uri: str) -> str | None:
    if not uri.startswith("sqlite:///"):
        return None  # sqlite:// alone is an in-memory database
    path = Path(uri[len("sqlite:///"):].split("?", 1)[0])
    moved = (f"move {path} aside (a new store is made there on the next run; every stage's work is kept)"
             if origin(uri) == HOME else f"point {_setting(uri)} at MLflow's SQLite file or at a new path (a store "
                                         "is made there)")
    if path.is_dir():
        return f"{path} is a folder where the database file belongs: name a file in it, e.g. sqlite:///{path / 'mlflow.db'}"
    if path.exists():
        try:
            with open(path, "rb") as fh:
                head = fh.read(len(_SQLITE_HEADER))
        except OSError as exc:
            return f"{path} cannot be read ({exc.strerror}): make it readable{or_the_local_store(uri)}"
        if head and head != _SQLITE_HEADER:
            return f"{path} is not a database (a file of something else): {moved}{or_the_local_store(uri)}"
        if not os.access(path, os.W_OK):
            return f"{path} {unwritable_why(path.parent) or NOT_PERMITTED}: make it " \
                   f"writable{or_the_local_store(uri)}"
    folder = next((p for p in path.parents if p.exists()), Path("/"))
    if not folder.is_dir():
        return f"{folder} is a file where a folder belongs: remove it or name another folder{or_the_local_store(uri)}"
    why = unwritable_why(folder)
    return f"its folder {folder} {why}: make it writable or name a folder you can write{or_the_local_store(uri)}" \
        if why else None


def _database_problem(uri: str) -> str | None:
    from sqlalchemy.engine import make_url

    try:
        make_url(uri).get_dialect().import_dbapi()
    except ModuleNotFoundError as exc:
        package = _DRIVER_PACKAGES.get(exc.name or "", exc.name)
        return f"its database driver {exc.name} is not installed: `pip install {package}`{or_the_local_store(uri)}"
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's own words for a driver it does not know
        return f"SQLAlchemy cannot load its driver ({' '.join(str(exc).split())}): name a driver it has" \
               f"{or_the_local_store(uri)}"
    return None


def store_problem(uri: str) -> str | None:
    """What keeps a local store from opening, and the fix, found without opening it; None when
    nothing is found (an HTTP store's check is ``unanswered``)."""
    if is_remote(uri):
        return None
    if uri.split(":", 1)[0] in ("databricks", "databricks-uc", "uc"):
        return None  # "databricks" alone is a URI too; its profile is Databricks' to check
    scheme = urlsplit(uri).scheme.split("+", 1)[0].lower()
    if scheme not in SCHEMES:
        return (f"MLflow knows no store of scheme {scheme}: (it opens sqlite:///, postgresql://, mysql://, mssql://, "
                f"http(s)://, file: and databricks): write the URI with one of them{or_the_local_store(uri)}")
    if scheme == "sqlite":
        return _sqlite_problem(uri)
    if scheme in _DATABASES:
        return _database_problem(uri)
    if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() != "true":
        return ("it is a folder store (file:), which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true: use "
                f"sqlite:///<folder>/mlflow.db{or_the_local_store(uri)}")
    return None


def database_words(exc: BaseException) -> str | None:
    """The database's own words along ``exc``'s chain, without the SQL SQLAlchemy appends; None
    when no database, driver or MLflow store error is in it."""
    found = [e for e in causes(exc) if type(e).__module__.startswith(("sqlite3", "sqlalchemy", "mlflow"))
             or isinstance(e, ModuleNotFoundError)]
    # The driver's own error, where there is one, says it best: the others wrap it.
    e = next((e for e in found if type(e).__module__.startswith("sqlite3")), found[0] if found else None)
    if e is None:
        return None
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e).split("\n[SQL", 1)[0].split("\n(Background", 1)[0]
    return " ".join(text.split())[:300]


def opening_line(uri: str, exc: BaseException | None = None) -> str | None:
    """The one line for a store that cannot be opened: what this module finds wrong with it,
    else (after a failed opening) the database's own words; None when neither says anything
    (``exc`` is then not the store's: a bug of ours goes on as it is)."""
    found = store_problem(uri)
    said = database_words(exc) if exc is not None else None
    if found is None and said is None:
        return None
    return f"{named(uri)} cannot be opened: {found or f'{said}: check that URI{or_the_local_store(uri)}'}"


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
    """A block opening the store ``uri``: what only opening finds (a damaged database, a driver's
    refusal) is raised as one-line :class:`TrackingUnavailable`; a full disk and our own bugs go on as they are."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, TrackingUnavailable) or disk_full(exc) or (line := opening_line(uri, exc)) is None:
            raise
        raise TrackingUnavailable(line) from exc


# When this process last found each store usable: a command checks its store once, before its
# work (the CLI before Prefect starts), not again when its run opens it a moment later.
_FOUND: dict[str, float] = {}
_FOUND_FOR_S = 120.0


def check_store(uri: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Raise :class:`TrackingUnavailable`, one line naming the fixes, when store ``uri`` cannot be
    used. An HTTP server is asked once within ``timeout_s``: MLflow's client retries for minutes."""
    if time.monotonic() - _FOUND.get(uri, -_FOUND_FOR_S) < _FOUND_FOR_S:
        return
    if not is_remote(uri):
        if (line := opening_line(uri)) is not None:
            raise TrackingUnavailable(line)
    elif (why := unanswered(uri, timeout_s)) is not None:
        raise TrackingUnavailable(f"the MLflow tracking server at {uri} does not answer ({why}): {fixes(uri)}")
    _FOUND[uri] = time.monotonic()


# SQLite's words for a database it may read but not write (its file or folder read-only).
_READ_ONLY = ("attempt to write a readonly database", "unable to open database file")


def store_folder(uri: str) -> str:
    """The folder a local store's files are in (a SQLite file's folder); the URI otherwise."""
    if uri.startswith("sqlite:///"):
        return os.path.dirname(uri[len("sqlite:///"):]) or "."
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri if "://" not in uri else ""


def lost_text(uri: str, state: dict[str, str]) -> str:
    """Why a local store was lost, with the fix: its disk filled, or it became read-only."""
    if state.get("full"):
        return disk_full_line(f"the MLflow store {uri}", state["full"], store=True)
    return f"the MLflow store {uri} cannot be written ({state['why']}): make {state['unwritable']} writable" \
           f"{or_the_local_store(uri)}"


def disk_loss(uri: str, exc: BaseException) -> dict[str, str] | None:
    """Why the store ``uri`` is lost, when ``exc`` is a full disk under it (its database or its
    artifacts) or a local store's file or folder that became read-only; None otherwise."""
    if disk_full(exc):
        return {"why": "its disk is full", "full": os.path.dirname(full_path(exc)) or store_folder(uri) or uri}
    if is_remote(uri):
        return None
    # The store's own error comes first along the chain; a stage's, being handled when the
    # store's call failed, comes after it and is not the store's to report.
    own = next((e for e in causes(exc) if refused(e) is e or any(words in str(e) for words in _READ_ONLY)), None)
    if own is None:
        return None
    if isinstance(own, OSError):
        path, why = fs_fault(own)
    else:
        path = Path(store_folder(uri))
        why = unwritable_why(path) or "is read-only to SQLite"
    return {"why": f"{path} {why}", "unwritable": str(path)}
