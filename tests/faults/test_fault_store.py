"""A tracking store that cannot be opened is named in one line: the URI, where it came from
(``MLFLOW_TRACKING_URI``, the recipe's ``tracking.tracking_uri`` or the project home), what is
wrong with it and the fix; at the start of a run and in every command that uses the store, with
nothing run and nothing marked done.

Each store is made for real: a text file where the database should be, a scheme MLflow does
not know, a driver that is not installed, a folder where the file belongs, a folder on a
read-only mount (a bind mount of itself; ``chmod`` does not stop root), a SQLite file damaged
past its header.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from embodied_r.apps.cli import main
from tests.faults.test_fault_disk import CLASS_NAME, _cli, _env, ro_folder  # noqa: F401 - a fixture

@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "[SQL" not in err and not CLASS_NAME.search(err), err
    return err


def _text_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("runs of last week, kept as notes\n")
    return path


# case -> (how the URI is given, the URI, what the line says is wrong, the fix it names)
def _cases(tmp: Path, home: Path) -> dict[str, tuple[str, str, str, str]]:
    text = _text_file(tmp / "notes.db")
    (tmp / "a-folder.db").mkdir()
    return {
        "text file": ("env", f"sqlite:///{text}", f"{text} is not a database",
                      "point MLFLOW_TRACKING_URI at MLflow's SQLite file or at a new path"),
        "text file, from the recipe": ("recipe", f"sqlite:///{text}", f"{text} is not a database",
                                       "remove tracking.tracking_uri from the recipe"),
        "unknown scheme": ("env", "mlflowdb://127.0.0.1/runs", "MLflow knows no store of scheme mlflowdb:",
                           "write the URI with one of them"),
        "driver not installed": ("env", "postgresql://runs@127.0.0.1:5432/mlflow",
                                 "its database driver psycopg2 is not installed", "`pip install psycopg2-binary`"),
        "folder where the file belongs": ("env", f"sqlite:///{tmp / 'a-folder.db'}",
                                          f"{tmp / 'a-folder.db'} is a folder where the database file belongs",
                                          f"e.g. sqlite:///{tmp / 'a-folder.db' / 'mlflow.db'}"),
        "the home's own store is not a database": ("home", f"sqlite:///{home / 'mlflow.db'}",
                                                   f"{home / 'mlflow.db'} is not a database",
                                                   f"move {home / 'mlflow.db'} aside"),
        "a folder store": ("env", f"file://{tmp / 'mlruns'}",
                           "it is a folder store (file:), which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true",
                           "use sqlite:///<folder>/mlflow.db"),
    }


ORIGIN = {"env": "(from MLFLOW_TRACKING_URI)", "recipe": "(the recipe's tracking.tracking_uri)",
          "home": "(the project home's own, EMBODIED_R_HOME)"}


@pytest.mark.parametrize("case", ["text file", "text file, from the recipe", "unknown scheme", "driver not installed",
                                  "folder where the file belongs", "the home's own store is not a database",
                                  "a folder store"])
def test_a_store_that_cannot_be_opened_stops_the_run_before_anything_runs(case, tmp_path, home, monkeypatch,
                                                                          capsys) -> None:
    given, uri, wrong, fix = _cases(tmp_path, home)[case]
    args = ["run", "--recipe", "smoke"]
    if given == "env":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    elif given == "recipe":
        args += ["--set", f"tracking.tracking_uri={uri}"]
    else:
        _text_file(home / "mlflow.db")
    assert main(args) == 2
    err = _one_line(capsys)
    assert err.startswith(f"error: the MLflow tracking store {uri} {ORIGIN[given]} cannot be opened: {wrong}"), err
    assert fix in err, err
    assert not (home / "stages").exists()  # nothing ran, nothing is marked done
    assert main(["validate", *args[1:]]) == 2 and _one_line(capsys) == err


def test_a_store_in_a_read_only_folder_is_named_with_the_folder(tmp_path, home, ro_folder, monkeypatch, capsys) -> None:
    from mlflow import MlflowClient

    folder = tmp_path / "store"
    folder.mkdir()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # a real store, then its folder read-only
    ro_folder(folder)
    capsys.readouterr()  # MLflow's lines as it made the store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["run", "--recipe", "smoke"]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"error: the MLflow tracking store {uri} (from MLFLOW_TRACKING_URI) cannot be opened: "
                          f"{folder / 'mlflow.db'} is on a read-only file system: make it writable"), err
    # A new store in that folder: the folder is named.
    uri = f"sqlite:///{folder / 'new.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["run", "--recipe", "smoke"]) == 2
    assert f"its folder {folder} is on a read-only file system" in _one_line(capsys)


def test_every_command_that_uses_the_store_names_it_first(tmp_path, home, monkeypatch, capsys) -> None:
    uri = f"sqlite:///{_text_file(tmp_path / 'notes.db')}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    said = f"error: the MLflow tracking store {uri} (from MLFLOW_TRACKING_URI) cannot be opened: "
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    for args in (["promote", "--recipe", "smoke"], ["register-model", "--recipe", "smoke", str(model)],
                 ["eval-model", "models:/embodied-r-reasoner@champion", "--recipe", "smoke"],
                 ["baselines", "--recipe", "smoke"],
                 ["experiment", "consistency", "--recipe", "smoke",
                  "--set", "evaluation.consistency_judge.kind=transformers"]):
        assert main(args) == 2, args
        err = _one_line(capsys)
        assert err.startswith(said) and "is not a database" in err, (args, err)
    assert not (home / "stages").exists()

    # The nightly re-evaluation (a deployment's flow), before it evaluates anything.
    from embodied_r.errors import TrackingUnavailable
    from flows.reevaluate import reevaluate

    with pytest.raises(TrackingUnavailable, match=re.escape(said[len("error: "):])):
        reevaluate.fn(recipe="smoke", home=str(home))


def test_a_database_damaged_past_its_header_is_named_when_opened(tmp_path, home) -> None:
    """What only opening finds is said as the store's too, in its database's words, not SQLAlchemy's."""
    import sqlite3

    from embodied_r.evaluation.registry import client
    from embodied_r.errors import TrackingUnavailable
    from embodied_r.tracking.runs import Tracker

    path = tmp_path / "mlflow.db"
    sqlite3.connect(path).execute("CREATE TABLE notes (x)").connection.commit()
    data = bytearray(path.read_bytes())
    data[100:] = b"\xff" * (len(data) - 100)  # the header stays, its schema page is gone
    path.write_bytes(bytes(data))
    uri = f"sqlite:///{path}"
    for opening in (lambda: Tracker.open("embodied-r", uri, home), lambda: client(uri).search_registered_models()):
        with pytest.raises(TrackingUnavailable) as caught:
            opening()
        text = str(caught.value)
        assert text.startswith(f"the MLflow tracking store {uri} (") and " cannot be opened: " in text, text
        assert "malformed" in text and "[SQL" not in text and "check that URI" in text, text


def test_a_store_that_becomes_read_only_mid_run_is_said_once_and_skipped(tmp_path, home, ro_folder, capsys) -> None:
    from embodied_r.tracking.runs import Tracker
    from embodied_r.tracking.link import lost_line, tracking_lost

    folder = tmp_path / "store"
    folder.mkdir()
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    tracker = Tracker.open("embodied-r", uri, home)
    run = tracker.start_stage("perception", {})
    ro_folder(folder)
    for _ in range(2):
        with tracker.guard("perception"):
            tracker.log_metrics(run, {"done": 1.0})
    assert tracking_lost(uri)
    said = [t for t in capsys.readouterr().out.splitlines() if "tracking lost" in t]
    assert len(said) == 1 and f"the MLflow store {uri} cannot be written ({folder} is on a read-only file " \
        "system)" in said[0], said
    assert lost_line(uri).startswith("tracking lost at perception: ") and "the rerun logs what is missing" in \
        lost_line(uri)


def test_the_issue_case_then_the_rerun_recomputes_nothing(tmp_path: Path) -> None:
    """A home with a stage done; the store swapped for a text file; then set right again."""
    home = tmp_path / "home"
    first = _cli(["download", "--recipe", "smoke"], _env(home))
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    text = _text_file(tmp_path / "notes.db")
    bad = _cli(["download", "--recipe", "smoke", "--refresh"], _env(home, MLFLOW_TRACKING_URI=f"sqlite:///{text}"))
    out = (bad.stdout + bad.stderr).strip()
    assert bad.returncode == 2 and "\n" not in out, out
    assert out.startswith(f"error: the MLflow tracking store sqlite:///{text} (from MLFLOW_TRACKING_URI) cannot be "
                          f"opened: {text} is not a database"), out
    again = _cli(["download", "--recipe", "smoke"], _env(home))
    assert again.returncode == 0 and "[stage] download      cached" in again.stdout, again.stdout[-3000:]
    assert " started" not in again.stdout
