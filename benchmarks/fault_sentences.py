"""A tracking store that cannot be opened, and the library errors that reach the CLI's
catch-all, for ``benchmarks/faults.py``.

The store cases run ``embodied-r run`` in processes of their own against stores made for real
(a text file, an unknown scheme, a driver not installed, a folder, a read-only folder); the
others run the tests of the same faults (``tests/faults/test_fault_store.py``,
``tests/faults/test_fault_sentences.py``), their pytest fixtures stood in for here.
"""

from __future__ import annotations

import io
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.fault_inputs import cli
from benchmarks.fault_kills import OK_ERROR, RECOVERED, case


class _Captured:
    """pytest's ``capsys`` outside pytest: what is printed, read and emptied by ``readouterr``."""

    def __init__(self) -> None:
        self.out, self.err = io.StringIO(), io.StringIO()

    def readouterr(self) -> Any:
        out, err = self.out.getvalue(), self.err.getvalue()
        self.out.seek(0), self.out.truncate(), self.err.seek(0), self.err.truncate()
        return type("Read", (), {"out": out, "err": err})()


@contextmanager
def _fixtures(tmp: Path) -> Iterator[dict[str, Any]]:
    """The fixtures the reused tests take: a home, monkeypatch, capsys and read-only folders."""
    import subprocess

    import pytest

    from tests.faults.test_fault_disk import read_only

    made: list[Path] = []

    def ro_folder(folder: Path) -> Path:
        if not read_only(folder):
            raise RuntimeError("a read-only bind mount needs root (or CAP_SYS_ADMIN) here")
        made.append(folder)
        return folder

    captured, saved = _Captured(), (sys.stdout, sys.stderr)
    home = tmp / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBODIED_R_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        sys.stdout, sys.stderr = captured.out, captured.err
        try:
            yield {"tmp_path": tmp, "home": home, "_home": home, "monkeypatch": mp, "capsys": captured,
                   "ro_folder": ro_folder}
        finally:
            sys.stdout, sys.stderr = saved
            for folder in reversed(made):
                subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _run(test: Callable[..., None], tmp: Path, **given: Any) -> None:
    import inspect

    tmp.mkdir(parents=True, exist_ok=True)
    with _fixtures(tmp) as fixtures:
        if "_home" in inspect.signature(test).parameters or "home" in inspect.signature(test).parameters:
            fixtures["home"].mkdir(exist_ok=True)
        test(**{name: given.get(name, fixtures.get(name)) for name in inspect.signature(test).parameters})


@case("tracking store: text file, unknown scheme, no driver, folder, file store, home's own")
def _stores(tmp: Path) -> tuple[str, str]:
    text = tmp / "notes.db"
    text.write_text("runs of last week, kept as notes\n")
    (tmp / "folder.db").mkdir()
    home = tmp / "home"
    stores = {"text file": f"sqlite:///{text}", "unknown scheme": "mlflowdb://127.0.0.1/runs",
              "no driver": "postgresql://runs@127.0.0.1:5432/mlflow", "folder": f"sqlite:///{tmp / 'folder.db'}",
              "file store": f"file://{tmp / 'mlruns'}"}
    said = []
    for name, uri in stores.items():
        res = cli(["run", "--recipe", "smoke"], home, MLFLOW_TRACKING_URI=uri)
        err = res.stderr.strip()
        if res.returncode != 2 or "\n" in err or not err.startswith(f"error: the MLflow tracking store {uri} (from "
                                                                    "MLFLOW_TRACKING_URI) cannot be opened: "):
            return f"{name}: {err[-300:]}", "FAIL: not one line naming the store"
        said.append(err.split(" cannot be opened: ", 1)[1].split(":", 1)[0])
    (home / "mlflow.db").write_text("not a database\n")
    res = cli(["run", "--recipe", "smoke"], home)
    if "(the project home's own, EMBODIED_R_HOME)" not in res.stderr or "aside" not in res.stderr:
        return res.stderr[-300:], "FAIL: the home's own store not named as such"
    if (home / "stages").exists():
        return "stages ran", "FAIL: work started on a store that cannot be opened"
    return "one line each, exit 2, nothing run: " + "; ".join(said)[:300], OK_ERROR


@case("tracking store: read-only folder, damaged database, read-only mid-run")
def _store_faults(tmp: Path) -> tuple[str, str]:
    from tests.faults import test_fault_store as t

    _run(t.test_a_store_in_a_read_only_folder_is_named_with_the_folder, tmp / "ro")
    _run(t.test_a_database_damaged_past_its_header_is_named_when_opened, tmp / "damaged")
    _run(t.test_a_store_that_becomes_read_only_mid_run_is_said_once_and_skipped, tmp / "mid")
    return ("named with the folder; damaged: SQLite's words, no SQL; mid-run: said once, later calls skipped, "
            "the rerun logs the rest"), OK_ERROR


@case("tracking store: promote, register-model, eval-model, baselines, experiment, nightly")
def _store_commands(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_store import test_every_command_that_uses_the_store_names_it_first as t

    _run(t, tmp)
    return "each names the store first, in one line, before its work", OK_ERROR


@case("tracking store not a database on a home with work done, then set right")
def _store_rerun(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_store import test_the_issue_case_then_the_rerun_recomputes_nothing as t

    t(tmp)
    return "one line, exit 2, even with --refresh nothing discarded; the rerun finds the stage cached", RECOVERED


@case("catch-all: file system, SQLite/SQLAlchemy, HTTP (3 clients), Prefect's API, YAML, JSON")
def _catch_all(tmp: Path) -> tuple[str, str]:
    from tests.faults import test_fault_sentences as t

    for i, test in enumerate((t.test_a_read_only_folder_is_named_with_its_fix,
                              t.test_a_read_only_folder_in_the_home_is_named_as_the_home,
                              t.test_a_file_where_a_folder_belongs_and_a_folder_where_a_file_belongs,
                              t.test_a_text_file_opened_as_a_database_is_named,
                              t.test_a_yaml_or_json_file_that_does_not_parse_is_named_with_its_line,
                              t.test_a_yaml_recipe_that_does_not_parse_is_one_line_naming_it)):
        _run(test, tmp / str(i))
    for i, kind in enumerate(("text file", "unknown scheme")):
        _run(t.test_the_tracking_store_met_by_mlflow_is_named_with_where_it_came_from, tmp / f"store{i}", case=kind)
    with t.serving_503() as url:
        _run(t.test_a_server_that_does_not_answer_is_named_whatever_the_client, tmp / "http", busy_server=url)
    t.test_a_prefect_api_that_does_not_answer_is_named_with_its_setting(tmp / "prefect")
    return "one line each naming the thing and the fix, no class name; --debug raises the original", OK_ERROR
