"""Whether the MLflow tracking store a run names can be opened, and where its URI came from.

MLflow says a store it cannot open in its libraries' words (SQLAlchemy's exception with its
SQL, a ``KeyError`` for a scheme it does not know, the missing driver's module name). The
causes are few and most show without opening the store: a file that is not a database, a
scheme MLflow does not know, a driver not installed, a folder where the database file
belongs, a folder that cannot be written. ``opening_line`` says each in one line naming the
URI, where it came from (``MLFLOW_TRACKING_URI``, the recipe's ``tracking.tracking_uri`` or the
project home) and the fix.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from urllib.parse import urlsplit

from embodied_r.errors import causes
from embodied_r.paths import NOT_PERMITTED, READ_ONLY

_lock = threading.Lock()


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


# Where a store's URI came from, noted where it is resolved (``tracking.tracking_uri``): a flow
# runs with MLFLOW_TRACKING_URI set to the URI it resolved, so the environment read later would
# name that variable for every store.
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


def origin(uri: str) -> str:
    with _lock:
        noted = _origins.get(uri)
    if noted:
        return noted
    from embodied_r.paths import default_tracking_uri

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
