"""A full disk, an unusable project home, and what is retried: each caused for real.

The disks are small tmpfs file systems mounted for the test (root, or a user allowed to mount,
is needed; elsewhere the tests are skipped with that reason). They fill as a user's disk fills:
by the stage's own writes, or, for the tracking store, by a file that takes the room left at
a known moment of the run (the moment is arranged, the full disk is real).
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_MOUNT = "mounting a tmpfs needs root (or CAP_SYS_ADMIN) here; a full disk cannot be made for real otherwise"
NO_READ_ONLY = "a read-only bind mount needs root (or CAP_SYS_ADMIN) here; chmod alone does not stop root"


# A class name as Python prints one ("OSError", "JSONDecodeError"): no error line of ours holds one.
CLASS_NAME = re.compile(r"\b[A-Z][A-Za-z0-9]*(Error|Exception|Exit|Warning)\b")


def read_only(folder: Path) -> bool:
    """Make ``folder`` read-only for everyone, root included: a read-only bind mount of itself
    (``chmod`` does not stop root). False where mounting is not allowed."""
    folder.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode:
        return False
    if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode:
        subprocess.run(["umount", str(folder)], capture_output=True)
        return False
    return True


@pytest.fixture
def ro_folder() -> Iterator[Callable[[Path], Path]]:
    """``ro_folder(path)``: ``path`` made read-only (``read_only``), made writable again after the test."""
    made: list[Path] = []

    def make(folder: Path) -> Path:
        if not read_only(folder):
            pytest.skip(NO_READ_ONLY)
        made.append(folder)
        return folder

    yield make
    for folder in reversed(made):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _mount(point: Path, options: str) -> bool:
    point.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
                          capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """``small_disk(name, options)``: a tmpfs mounted at ``tmp_path/name`` (``size=8m``, ``ro``...),
    unmounted after the test."""
    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        point = tmp_path / name
        if not _mount(point, options):
            pytest.skip(NO_MOUNT)
        mounted.append(point)
        return point

    yield make
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _env(home: Path, **extra: str) -> dict[str, str]:
    # Prefect's own database stays off the small disk: its failures are Prefect's, not ours.
    return {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_R_HOME": str(home),
            "PREFECT_HOME": str(home.parent / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **extra}


def _cli(args: list[str], env: dict[str, str], code: str | None = None) -> subprocess.CompletedProcess:
    head = ["-c", code] if code else ["-m", "embodied_r.apps.cli"]
    return subprocess.run([sys.executable, *head, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def _after_stage_lines(text: str) -> list[str]:
    lines = [t for t in text.splitlines() if t.strip()]
    last = max((i for i, t in enumerate(lines) if t.startswith("[stage]")), default=-1)
    return lines[last + 1:]


def fill(folder: Path) -> Path:
    """Take every byte left on the disk of ``folder``: a real ENOSPC for the next write."""
    ballast = folder / "ballast"
    # Unbuffered: a write the disk takes only in part would leave its rest in a buffer, and the
    # close would fail on it with ENOSPC (one free space in sixteen), out of this function.
    with open(ballast, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return ballast


@pytest.mark.e2e
def test_a_disk_that_fills_during_a_stage_stops_it_in_one_line_and_the_rerun_finishes(small_disk, tmp_path) -> None:
    disk = small_disk("disk", "size=8m")  # the smoke benchmark needs about 21 MB; the store fits
    home = disk / "home"
    started = time.monotonic()
    full = _cli(["download", "--recipe", "smoke"], _env(home))
    took = time.monotonic() - started
    text = full.stdout + full.stderr
    assert full.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "[SQL" not in text and "moov atom" not in text and "WARN" not in text, \
        text[-3000:]
    assert len(_after_stage_lines(text)) <= 3, text[-3000:]
    (error,) = [t for t in full.stderr.splitlines() if t.startswith("error:")]
    assert error.startswith(f"error: download: the disk under {home}") and " is full (" in error, error
    assert "free space there or move the project home (EMBODIED_R_HOME)" in error and ".partial" in error
    # Said once as the stage's, and once as the store's (in the same home), each in one line.
    assert sum("tracking lost" in t for t in full.stdout.splitlines()) == 1, full.stdout
    # Not retried: a full disk is still full ten seconds later.
    assert text.count("[stage] download      started") == 1 and took < 120, text[-3000:]
    folders = sorted(p.name for p in (home / "stages" / "download").iterdir())
    assert not [f for f in folders if not f.endswith((".partial", ".lock"))], folders  # nothing marked done

    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # room made
    again = _cli(["download", "--recipe", "smoke"], _env(home))
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert [p for p in (home / "stages" / "download").iterdir() if p.suffix == "" and p.is_dir()]


# Fills the store's disk when the preprocess stage starts (its MLflow child run is open by then).
FILL_AT_PREPROCESS = """
import sys
from pathlib import Path
import tasks.stages as stages
from tests.faults.test_fault_disk import fill
announce = stages._announce
def at(sp, event, *args, **kwargs):
    if sp.name == "preprocess" and event == "started":
        fill(Path({disk!r}))
    return announce(sp, event, *args, **kwargs)
stages._announce = at
from embodied_r.apps.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.e2e
def test_a_tracking_store_whose_disk_fills_is_said_once_and_then_skipped(small_disk, tmp_path) -> None:
    disk = small_disk("store", "size=16m")
    home = tmp_path / "home"
    env = _env(home, MLFLOW_TRACKING_URI=f"sqlite:///{disk / 'mlflow.db'}")
    first = _cli(["download", "--recipe", "smoke"], env)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]

    # Prefect is imported before the CLI sets its log level, by the hook's import of the tasks.
    lost = _cli(["preprocess", "--recipe", "smoke"], {**env, "PREFECT_LOGGING_LEVEL": "CRITICAL"},
                FILL_AT_PREPROCESS.format(disk=str(disk)))
    text = lost.stdout + lost.stderr
    assert lost.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "[SQL" not in text and "database or disk is full" not in text, text[-3000:]
    said = [t for t in lost.stdout.splitlines() if "tracking lost" in t]
    assert len(said) == 1 and f"the MLflow store sqlite:///{disk / 'mlflow.db'}" in said[0], lost.stdout
    assert f"the disk under {disk} is full" in said[0] and "MLFLOW_TRACKING_URI" in said[0]
    assert "[stage] preprocess    done" in lost.stdout  # the work went on, untracked
    (error,) = [t for t in lost.stderr.splitlines() if t.startswith("error:")]
    assert error.startswith("error: tracking lost at preprocess: the MLflow store") and "rerun logs" in error
    assert lost.stderr.strip() == error, lost.stderr[-3000:]  # the run's usual outcome above it, on stdout

    (disk / "ballast").unlink()  # room made
    again = _cli(["preprocess", "--recipe", "smoke"], env)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert " started" not in again.stdout and "tracking lost" not in again.stdout + again.stderr


@pytest.mark.parametrize("where", ["under a file", "read-only", "full"])
def test_an_unusable_home_is_named_as_the_project_home_with_its_fix(small_disk, tmp_path, where) -> None:
    if where == "under a file":
        (tmp_path / "a-file").write_text("not a folder")
        home = tmp_path / "a-file" / "home"
    elif where == "read-only":
        home = small_disk("ro", "ro,size=1m") / "home"
    else:
        disk = small_disk("full", "size=1m")
        home = disk / "home"
        home.mkdir()
        fill(disk)
    done = _cli(["run", "--recipe", "smoke"], _env(home))
    text = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and "\n" not in text and "Traceback" not in text, text
    assert text.startswith(f"error: the project home {home}"), text
    if where == "full":
        assert "is full" in text and "move the project home (EMBODIED_R_HOME)" in text
    else:
        assert "(EMBODIED_R_HOME) cannot be" in text and "--home" in text


@contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only for everyone, root included, for the block: a read-only bind mount of
    itself (``chmod`` does not stop root)."""
    if not read_only(folder):
        pytest.skip(NO_READ_ONLY)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def test_a_home_with_finished_work_on_a_read_only_mount_is_named_and_kept(tmp_path) -> None:
    home = tmp_path / "home"
    first = _cli(["download", "--recipe", "smoke"], _env(home))
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    with _read_only(home):
        again = _cli(["download", "--recipe", "smoke"], _env(home))
    text = (again.stdout + again.stderr).strip()
    assert again.returncode == 2 and "\n" not in text and "Traceback" not in text and ".tmp" not in text, text
    assert text.startswith(f"error: the project home {home} (EMBODIED_R_HOME) cannot be written: {home} is on a "
                           "read-only file system. Make it writable, or set EMBODIED_R_HOME, or pass --home"), text
    assert "relocate --home" in text, text
    rerun = _cli(["download", "--recipe", "smoke"], _env(home))  # writable again: nothing redone
    assert rerun.returncode == 0 and "[stage] download      cached" in rerun.stdout, rerun.stdout[-3000:]


# Makes the home read-only after perception's fifth item, the way a file system that fails is
# remounted read-only under a running process: files already open stay writable, every new
# write fails (a read-only bind mount of the home over itself; remounting the home's own file
# system would be refused while the run holds files open on it).
UPSTREAM_OF_PERCEPTION = """
import sys
from embodied_r.apps.cli import main
for stage in ("download", "preprocess", "keyframes"):
    if main([stage, "--recipe", "smoke"]):
        sys.exit(f"{stage} failed")
"""

READ_ONLY_AT_ITEM = """
import os, subprocess, sys
import embodied_r.perception.stage as stage
done, count, home = stage.item_done, [0], os.environ["EMBODIED_R_HOME"]
def at(name):
    done(name)
    if name == "perception":
        count[0] += 1
        if count[0] == 5:
            subprocess.run(["mount", "--bind", home, home], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", home], check=True)
stage.item_done = at
from embodied_r.apps.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.e2e
def test_a_home_that_becomes_read_only_mid_stage_fails_it_once_and_the_rerun_resumes(tmp_path) -> None:
    home = tmp_path / "home"
    probe = tmp_path / "probe"
    if not read_only(probe):
        pytest.skip(NO_READ_ONLY)
    subprocess.run(["umount", str(probe)], check=True)
    # The stages before perception in one process: one interpreter and one Prefect server
    # start instead of three (about 20 s of the suite); the fault itself runs as a user's command.
    done = _cli([], _env(home), UPSTREAM_OF_PERCEPTION)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    try:
        failed = _cli(["perception", "--recipe", "smoke"], _env(home, PREFECT_LOGGING_LEVEL="CRITICAL"),
                      READ_ONLY_AT_ITEM)
    finally:
        subprocess.run(["umount", "-l", str(home)], capture_output=True)
    text = failed.stdout + failed.stderr
    assert failed.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "[SQL" not in text and "Errno" not in text, text[-3000:]
    assert text.count("[stage] perception    started") == 1, text[-3000:]  # failed once, not retried
    assert "[stage] perception    failed" in text and "home not writable" in text, text[-3000:]
    assert len(_after_stage_lines(text)) <= 3, text[-3000:]
    (error,) = [t for t in failed.stderr.splitlines() if t.startswith("error:")]
    (partial,) = (home / "stages" / "perception").glob("*.partial")
    assert error.startswith(f"error: perception: the project home {home} (EMBODIED_R_HOME) cannot be written: "
                            f"{partial} is on a read-only file system"), error
    assert error.endswith(f"the stage's work so far is kept in {partial.name} and the rerun resumes it"), error
    kept = (partial / "items.jsonl").read_text().splitlines()
    assert len(kept) >= 5 and not [p for p in partial.parent.iterdir() if p.is_dir() and p.suffix == ""]

    rerun = _cli(["perception", "--recipe", "smoke"], _env(home))
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    final = partial.with_suffix("")
    items = (final / "items.jsonl").read_text().splitlines()
    # Resumed: what was kept comes first, as it was, and no call was made twice.
    assert items[:len(kept)] == kept and len({json.loads(t)["key"] for t in items}) == len(items)


def test_a_damaged_home_marker_is_named_with_both_fixes(tmp_path, monkeypatch, capsys) -> None:
    from embodied_r.apps.cli import main
    from embodied_r.paths import HOME_MARKER

    home = tmp_path / "home"
    home.mkdir()
    (home / HOME_MARKER).write_text('{"path": ')  # cut short
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    assert main(["plan", "--recipe", "smoke"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: the project home {home} (EMBODIED_R_HOME) has a damaged {home / HOME_MARKER}"), err
    assert "delete that file" in err and f"embodied-r relocate --home {home}" in err and "\n" not in err, err


def test_only_a_failure_that_may_pass_is_retried() -> None:
    """One rule for every stage's retries (``errors.may_pass``)."""
    import zipfile

    import pyarrow as pa
    from prefect.states import Failed
    from pydantic import BaseModel

    from embodied_r.errors import (DataSourceError, DiskFull, DiskSpaceError, HomeUnusable, InfraFailure, RecipeError,
                                   StageBusy, StageError, VideoError)
    from tasks.stages import _worth_retrying

    class Strict(BaseModel):
        n: int

    try:
        Strict(n="x")
    except Exception as exc:  # noqa: BLE001 - pydantic's own ValidationError, as a bad recipe raises it
        invalid = exc
    sqlite_full = RuntimeError("(sqlite3.OperationalError) database or disk is full")
    wrapped = RuntimeError("training failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device", "/x/checkpoint-4")
    never = [DiskSpaceError("needs 43 GB"), DiskFull("full"), OSError(errno.ENOSPC, "No space left on device"),
             OSError(errno.EDQUOT, "Disk quota exceeded"), sqlite_full, wrapped, RecipeError("bad key"), invalid,
             StageError("unknown stage"), DataSourceError("not laid out"), zipfile.BadZipFile("bad"),
             pa.ArrowInvalid("magic bytes"), VideoError("unreadable", "v.mp4", "corrupt"), PermissionError("ro"),
             FileNotFoundError("gone"), StageBusy("held"), InfraFailure("down"), HomeUnusable("home")]
    for exc in never:
        assert not _worth_retrying(None, None, Failed(data=exc)), repr(exc)
    for exc in [RuntimeError("training failed (exit code 1)"), ConnectionResetError("reset"),
                TimeoutError("slow"), OSError(errno.EIO, "I/O error")]:
        assert _worth_retrying(None, None, Failed(data=exc)), repr(exc)
