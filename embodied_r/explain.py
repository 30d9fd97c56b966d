"""What a command prints of an error, and its exit status (``said``): ours as its own line; a
library's (the file system, SQLite and SQLAlchemy, HTTP clients, YAML, JSON) as the project's
sentence naming the thing, why and the fix; anything else, most likely a bug, as it is."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

from embodied_r.errors import ProjectError, causes
from embodied_r.redaction import redact

AGAIN = "and run the same command again"


def _frames(exc: BaseException) -> Iterator[FrameType]:
    """The frames every error along ``exc``'s chain passed through, innermost first."""
    for e in causes(exc):
        tb, frames = e.__traceback__, []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        yield from reversed(frames)


def _modules(exc: BaseException) -> set[str]:
    """The top-level packages whose code raised or passed on ``exc``."""
    return {str(f.f_globals.get("__name__", "")).split(".")[0] for f in _frames(exc)}


def file_in_traceback(exc: BaseException, suffixes: tuple[str, ...]) -> Path | None:
    """The file that was being read when ``exc`` was raised, where a frame holds it: a path or
    an open file among the locals of the innermost frame that has one with a suffix in
    ``suffixes``. JSON's and often YAML's errors name no file: the reader's frame does."""
    for frame in _frames(exc):
        for value in list(frame.f_locals.values()):
            name = getattr(value, "name", None) if hasattr(value, "read") else value
            if isinstance(name, (str, os.PathLike)) and str(name).endswith(suffixes):
                try:
                    if Path(name).is_file():
                        return Path(name).resolve()
                except (OSError, ValueError):
                    continue
    return None


def _first(exc: BaseException, test: Callable[[BaseException], bool]) -> Any:
    return next((e for e in causes(exc) if test(e)), None)


def _from(*packages: str) -> Callable[[BaseException], bool]:
    return lambda e: type(e).__module__.split(".")[0] in packages


# -- YAML and JSON ---------------------------------------------------------------------------

def yaml_words(exc: BaseException) -> str:
    """Where a YAML text stops parsing and why, in one line: ``line 2, column 11: expected ','
    or ']', but got '<stream end>'`` (PyYAML's own text spans lines and names no file when it
    read a string)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    words = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context = getattr(exc, "context", None)
    if context and getattr(exc, "problem", None):
        words = f"{words} ({' '.join(str(context).split())})"
    return f"line {mark.line + 1}, column {mark.column + 1}: {words}" if mark is not None else words


def _yaml(exc: BaseException, command: str) -> str | None:
    e = _first(exc, _from("yaml"))
    if e is None:
        return None
    mark = getattr(e, "problem_mark", None)
    named = getattr(mark, "name", "") or ""
    path = Path(named) if named and not named.startswith("<") else file_in_traceback(exc, (".yaml", ".yml"))
    what = f"{path}" if path else "a YAML text"
    return f"embodied-r {command}: {what} is not valid YAML at {yaml_words(e)}: fix it there {AGAIN}"


def _json(exc: BaseException, command: str) -> str | None:
    import json

    e = _first(exc, lambda x: isinstance(x, json.JSONDecodeError))
    if e is None:
        return None
    path = file_in_traceback(exc, (".json", ".jsonl"))
    where = f"line {e.lineno}, column {e.colno}: {e.msg}"
    if path is None:
        return f"embodied-r {command}: a JSON text is not valid JSON at {where}: run with --debug to see whose it is"
    from embodied_r.paths import home, in_home

    fix = (f"it is the project home's ({home()}, EMBODIED_R_HOME): if a stage wrote it, remove that stage's folder "
           "or rerun the stage with --refresh" if in_home(path) else "fix it there")
    return f"embodied-r {command}: {path} is not valid JSON at {where}: {fix} {AGAIN}"


# -- databases -------------------------------------------------------------------------------

def _prefect_database() -> str:
    try:
        from prefect.settings import get_current_settings

        settings = get_current_settings()
        url = settings.server.database.connection_url
        if url is None:
            return f"sqlite:///{settings.home / 'prefect.db'}"
        parts = urlsplit(url.get_secret_value())
        # A server's URL may carry its password: the host says which database it is.
        return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    except Exception:  # noqa: BLE001 - where Prefect keeps it is a detail of the sentence
        return "its database in PREFECT_HOME"


def _stores() -> list[str]:
    """The tracking stores this process may have been using: the one the environment names
    now, then those it resolved (a recipe's own among them), the latest first."""
    from embodied_r.tracking.store import noted, tracking_uri

    return list(dict.fromkeys([tracking_uri(), *noted()]))


def _database(exc: BaseException, command: str) -> str | None:
    from embodied_r.tracking.store import database_words, opening_line, store_problem

    owners = _modules(exc)
    db_error = _first(exc, _from("sqlite3", "sqlalchemy"))
    if "mlflow" in owners and _first(exc, _from("mlflow", "sqlite3", "sqlalchemy")):
        stores = _stores()
        broken = next((u for u in stores if store_problem(u)), None)
        if broken or db_error is not None:
            return opening_line(broken or stores[0], exc)
    if db_error is None:
        return None
    words = database_words(exc)
    if "prefect" in owners:
        return (f"embodied-r {command}: Prefect's database {_prefect_database()} cannot be used ({words}): move it "
                "aside (Prefect makes a new one; the project home keeps every stage's work) or set PREFECT_HOME "
                f"to another folder, {AGAIN}")
    path = file_in_traceback(exc, (".db", ".sqlite", ".sqlite3"))
    if path is None:
        return f"embodied-r {command}: a database failed ({words}): run with --debug to see which"
    from embodied_r.paths import default_tracking_uri

    uri = f"sqlite:///{path}"
    if uri in (default_tracking_uri(), *_stores()):  # the store itself, read by hand (relocate)
        return opening_line(uri, exc)
    return (f"embodied-r {command}: the SQLite database {path} cannot be used ({words}): move it aside or "
            f"name another {AGAIN}")


# -- HTTP ------------------------------------------------------------------------------------

_PREFECT_UNREACHED = re.compile(r"Failed to reach API at (\S+)")


def _url(exc: BaseException) -> str:
    """The address the failed request went to: from the error where it carries it, else from the
    frame that sent it."""
    for e in causes(exc):
        if m := _PREFECT_UNREACHED.search(str(e)):
            return m.group(1)
        for holder in (e, getattr(e, "response", None)):
            try:
                url = getattr(getattr(holder, "request", None), "url", None)
            except RuntimeError:  # httpx's request property raises when it was never set
                url = None
            if url:
                return str(url)
        if isinstance(getattr(e, "url", None), str):
            return e.url
    for frame in _frames(exc):
        for name in ("full_url", "url", "fullurl", "base_url"):
            value = frame.f_locals.get(name)
            value = getattr(value, "full_url", value)
            if isinstance(value, str) and value.startswith(("http://", "https://")):
                return value
    return ""


def _status(exc: BaseException) -> int | None:
    for e in causes(exc):
        for holder in (e, getattr(e, "response", None)):
            code = getattr(holder, "status_code", None) or getattr(holder, "code", None)
            if isinstance(code, int) and 100 <= code < 600:
                return code
    return None


def _http_why(exc: BaseException) -> str:
    import socket

    if (code := _status(exc)) is not None:
        return f"HTTP {code}"
    if _first(exc, lambda e: isinstance(e, ConnectionRefusedError) or "connection refused" in str(e).lower()):
        return "connection refused"
    if _first(exc, lambda e: isinstance(e, socket.gaierror) or "name or service not known" in str(e).lower()):
        return "its host name does not resolve"
    if _first(exc, lambda e: isinstance(e, TimeoutError) or "timed out" in str(e).lower()):
        return "no answer in time"
    inner = list(causes(exc))[-1]
    return " ".join(str(getattr(inner, "reason", inner)).split())[:200] or "no answer"


def _prefect_api() -> str:
    try:
        from prefect.settings import get_current_settings

        return str(get_current_settings().api.url or "")
    except Exception:  # noqa: BLE001
        return os.environ.get("PREFECT_API_URL", "")


def _http(exc: BaseException, command: str) -> str | None:
    import socket
    import urllib.error

    e = _first(exc, lambda x: isinstance(x, (urllib.error.URLError, ConnectionError, TimeoutError, socket.gaierror))
               or _from("httpx", "httpcore", "requests", "urllib3", "aiohttp")(x)
               or bool(_PREFECT_UNREACHED.search(str(x))))
    if e is None:
        return None
    url, why = _url(exc), _http_why(exc)
    api = _prefect_api().rstrip("/")
    if api and url.startswith(api) or _PREFECT_UNREACHED.search(str(e)):
        return (f"embodied-r {command}: Prefect's API server at {url or api} (PREFECT_API_URL) does not answer ({why}): "
                f"start it (`prefect server start`) or unset PREFECT_API_URL for a server of the run's own, {AGAIN}")
    store = next((u for u in _stores() if u.startswith("http") and url.startswith(u.rstrip("/"))), "")
    if url and store:
        from embodied_r.tracking.store import fixes

        return f"embodied-r {command}: the MLflow tracking server at {store} does not answer ({why}): {fixes(store)}"
    if "huggingface" in url or (os.environ.get("HF_ENDPOINT") and url.startswith(os.environ["HF_ENDPOINT"])):
        return (f"embodied-r {command}: the Hugging Face hub at {url} does not answer ({why}): check the network, "
                f"or take the benchmarks from a local mirror (--source DIR), {AGAIN}")
    server = f"the server at {url}" if url else "a server"
    return (f"embodied-r {command}: {server} does not answer ({why}): check that it runs and that the setting that "
            f"names it (a backend's base_url in the recipe) is right, {AGAIN}")


# -- the file system -------------------------------------------------------------------------

_FIXES = {errno.ENOENT: "check the path", errno.EROFS: "make it writable or write elsewhere",
          errno.EACCES: "change its permissions or use another path",
          errno.EPERM: "change its permissions or use another path",
          errno.ENOTDIR: "move that file away or use another path", errno.EEXIST: "move that file away or use another path",
          errno.EISDIR: "name a file, not a folder"}


def _os(exc: BaseException, command: str) -> str | None:
    from embodied_r.errors import disk_full, full_path
    from embodied_r.paths import disk_full_line, fs_fault, home, home_line, in_home, refused

    if disk_full(exc):
        # Outside a stage (a stage names its own folder): the file's folder, else the home.
        folder = Path(full_path(exc)).parent if full_path(exc) else home()
        return disk_full_line(f"embodied-r {command}", folder)
    denied = refused(exc)
    if denied is not None and in_home(denied.filename):
        return home_line(home(), denied)
    e = _first(exc, lambda x: isinstance(x, OSError) and x.filename is not None)
    if e is None:
        return None
    path, why = fs_fault(e)
    return f"embodied-r {command}: {path} {why}: {_FIXES.get(e.errno or 0, 'check it')} {AGAIN}"


_RULES = (_yaml, _json, _database, _http, _os)


def explain(exc: BaseException, command: str) -> str | None:
    """``exc`` as one line of the project's (no class name, the thing, why, the fix), for the
    families this module knows; None for anything else."""
    for rule in _RULES:
        if (line := rule(exc, command)) is not None:
            return line
    return None


def said(exc: BaseException, command: str) -> tuple[str, int]:
    """The line ``command`` prints of ``exc``, redacted, and its exit status."""
    if isinstance(exc, ProjectError):
        return redact(exc.line()), exc.status
    line = explain(exc, command) or (f"{type(exc).__name__}: {' '.join(str(exc).split())[:1500]} "
                                     "(run with --debug for the traceback)")
    return redact(line), 1
