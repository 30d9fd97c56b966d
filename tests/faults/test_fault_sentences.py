"""The CLI's catch-all says a library's error as the project's own sentence.

Each case makes a real error of one family that reaches the catch-all (the file system, SQLite
and SQLAlchemy, HTTP clients, YAML, JSON) by doing for real what fails: writing into a
read-only mount, opening a text file as a database, asking a closed port or a server that
answers 503, parsing a broken file. The failing call runs as a command of ``embodied-r``
(``recipes``, its handler swapped for the call), so the error walks the same ``main`` a user's
does. The last line must name the thing (path, store, server or file) and the fix, and hold no
bare exception class name; ``--debug`` still raises the library's own exception.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import urllib.request
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

import pytest

from embodied_r.apps import cli
from embodied_r.errors import causes
from tests.servers import free_port
from tests.faults.test_fault_disk import CLASS_NAME, _cli, _env, ro_folder  # noqa: F401 - a fixture



class _Unavailable(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving_503() -> Iterator[str]:
    """A real server on 127.0.0.1 that answers every request with 503."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/models"
    finally:
        server.shutdown()


@pytest.fixture
def busy_server() -> Iterator[str]:
    with serving_503() as url:
        yield url


def _walk(call: Callable[[], object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
          *, debug: bool = True) -> tuple[str, set[str]]:
    """``call`` as the handler of ``embodied-r recipes``: the last line printed, and the class
    names along the error's chain. With ``debug``, ``--debug`` is checked to raise the library's
    exception itself."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the case's own error, for its class names
        raised = exc
    else:
        raise AssertionError("the case did not fail")
    names = {type(e).__name__ for e in causes(raised)}

    def handler(_: object) -> int:
        call()
        return 0

    monkeypatch.setattr(cli, "_cmd_recipes", handler)
    assert cli.main(["recipes"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert not (names & set(re.findall(r"\w+", err))) and not CLASS_NAME.search(err), (names, err)
    assert "--debug for the traceback" not in err, err
    if debug:
        with pytest.raises(type(raised)):
            cli.main(["--debug", "recipes"])
    return err, names


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


# -- the file system ------------------------------------------------------------------------

def test_a_read_only_folder_is_named_with_its_fix(tmp_path, ro_folder, monkeypatch, capsys) -> None:
    out = ro_folder(tmp_path / "out")
    err, _ = _walk(lambda: (out / "answers.json").write_text("[]"), monkeypatch, capsys)
    assert f"{out} is on a read-only file system" in err and "make it writable or write elsewhere" in err, err


def test_a_read_only_folder_in_the_home_is_named_as_the_home(_home, ro_folder, monkeypatch, capsys) -> None:
    stages = ro_folder(_home / "stages")
    err, _ = _walk(lambda: (stages / "keyframes").mkdir(), monkeypatch, capsys)
    assert err.startswith(f"error: the project home {_home} (EMBODIED_R_HOME) cannot be written: {stages} is on a "
                          "read-only file system"), err
    assert "--home" in err and "relocate" in err, err


def test_a_file_where_a_folder_belongs_and_a_folder_where_a_file_belongs(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "videos").write_text("a file")
    err, _ = _walk(lambda: (tmp_path / "videos" / "a" / "b").mkdir(parents=True), monkeypatch, capsys)
    assert f"{tmp_path / 'videos'} is a file where a folder belongs: move that file away" in err, err
    (tmp_path / "answers.json").mkdir()
    err, _ = _walk(lambda: (tmp_path / "answers.json").read_text(), monkeypatch, capsys)
    assert f"{tmp_path / 'answers.json'} is a folder where a file belongs: name a file" in err, err
    err, _ = _walk(lambda: (tmp_path / "missing.txt").read_text(), monkeypatch, capsys)
    assert f"{tmp_path / 'missing.txt'} does not exist: check the path" in err, err


# -- SQLite and SQLAlchemy -------------------------------------------------------------------

def test_a_text_file_opened_as_a_database_is_named(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "runs.db"
    path.write_text("not a database\n" * 10)

    def with_sqlite() -> None:
        sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall()

    err, _ = _walk(with_sqlite, monkeypatch, capsys)
    assert f"the SQLite database {path} cannot be used (file is not a database)" in err and "[SQL" not in err, err

    def with_sqlalchemy() -> None:
        from sqlalchemy import create_engine, text

        with create_engine(f"sqlite:///{path}").connect() as db:
            db.execute(text("SELECT name FROM sqlite_master"))

    err, _ = _walk(with_sqlalchemy, monkeypatch, capsys)
    assert f"the SQLite database {path} cannot be used (file is not a database)" in err and "[SQL" not in err, err


@pytest.mark.parametrize("case", ["text file", "unknown scheme"])
def test_the_tracking_store_met_by_mlflow_is_named_with_where_it_came_from(case, tmp_path, monkeypatch,
                                                                             capsys) -> None:
    from mlflow import MlflowClient

    if case == "text file":
        (tmp_path / "mlflow.db").write_text("not a database\n")
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    else:
        uri = "foo://127.0.0.1/store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    err, _ = _walk(lambda: MlflowClient(tracking_uri=uri).get_experiment_by_name("x"), monkeypatch, capsys)
    assert err.startswith(f"error: the MLflow tracking store {uri} (from MLFLOW_TRACKING_URI) cannot be opened: "), err
    assert "leave MLFLOW_TRACKING_URI unset" in err and "[SQL" not in err, err


# -- HTTP ------------------------------------------------------------------------------------

def test_a_server_that_does_not_answer_is_named_whatever_the_client(busy_server, monkeypatch, capsys) -> None:
    import httpx
    import requests

    closed = f"http://127.0.0.1:{free_port()}/v1/models"
    calls: list[tuple[Callable[[], object], str, str]] = [
        (lambda: urllib.request.urlopen(closed, timeout=5), closed, "connection refused"),
        (lambda: urllib.request.urlopen(busy_server, timeout=5), busy_server, "HTTP 503"),
        (lambda: httpx.get(closed, timeout=5), closed, "connection refused"),
        (lambda: httpx.get(busy_server, timeout=5).raise_for_status(), busy_server, "HTTP 503"),
        (lambda: requests.get(closed, timeout=5), closed, "connection refused"),
        (lambda: requests.get(busy_server, timeout=5).raise_for_status(), busy_server, "HTTP 503"),
    ]
    for call, url, why in calls:
        err, names = _walk(call, monkeypatch, capsys)
        assert f"the server at {url} does not answer ({why}): check that it runs" in err, (names, err)


def test_a_prefect_api_that_does_not_answer_is_named_with_its_setting(tmp_path: Path) -> None:

    url = f"http://127.0.0.1:{free_port()}/api"
    done = _cli(["download", "--recipe", "smoke"], _env(tmp_path / "home", PREFECT_API_URL=url))
    last = (done.stdout + done.stderr).strip().splitlines()[-1]
    assert done.returncode == 1 and not CLASS_NAME.search(last), last
    assert last.startswith(f"error: embodied-r download: Prefect's API server at {url}") and \
        "(PREFECT_API_URL) does not answer" in last and "unset PREFECT_API_URL" in last, last
    assert not (tmp_path / "home" / "stages").exists()


# -- YAML and JSON ---------------------------------------------------------------------------

def test_a_yaml_or_json_file_that_does_not_parse_is_named_with_its_line(tmp_path, _home, monkeypatch,
                                                                       capsys) -> None:
    import yaml

    broken = tmp_path / "settings.yaml"
    broken.write_text("server:\n  url: [http://127.0.0.1\n")
    for call in (lambda: yaml.safe_load(broken.read_text()), lambda: yaml.safe_load(open(broken))):
        err, _ = _walk(call, monkeypatch, capsys)
        assert f"{broken} is not valid YAML at line 3, column 1: expected ',' or ']'" in err, err
        assert "fix it there and run the same command again" in err and "<unicode string>" not in err, err
    answers = tmp_path / "answers.json"
    answers.write_text('[{"question": "left or right?"},\n')
    for call in (lambda: json.loads(answers.read_text()), lambda: json.load(open(answers))):
        err, _ = _walk(call, monkeypatch, capsys)
        assert f"{answers} is not valid JSON at line 2, column 1: Expecting value: fix it there" in err, err
    summary = _home / "stages" / "convert" / "abc" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text('{"done": 3')
    err, _ = _walk(lambda: json.loads(summary.read_text()), monkeypatch, capsys)
    assert f"{summary} is not valid JSON" in err and f"it is the project home's ({_home}" in err and \
        "--refresh" in err, err


def test_a_yaml_recipe_that_does_not_parse_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("extends: smoke\ntraining: [a\n")
    assert cli.main(["validate", "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: recipe {recipe} is not valid YAML at line 3, column 1: expected ',' or ']', but got "
                   "'<stream end>' (while parsing a flow sequence): fix it there"), err
