"""Code keys read from the library's files: safe beside threads that parse (as a flow run's do)
and kept on disk by file size and mtime, so an unchanged install parses nothing and a change is
read again."""

from __future__ import annotations

import gc
import os
import re
import shutil
import sys
import threading
import time
import traceback

import pytest

from embodied_r import code_keys
from embodied_r.code_keys import PACKAGE, ROOT
from tests.test_architecture import library_modules
from tests.test_code_keys import keys


class _Finalized:
    """Garbage in a reference cycle whose finalizer hands the GIL to another thread, as closing a
    socket or a transport does when the collector reaches it."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        time.sleep(0)


def _raise_deep(depth: int) -> None:
    if depth:
        _raise_deep(depth - 1)
    {"a": [1]}["a"][2] + 1  # noqa: B018 - a line whose carets need a parse to place


def _format_tracebacks(until: float, formatted: list[int]) -> None:
    """A thread that logs exceptions, as Prefect's do while its server is away: each traceback
    formatted parses its frames' lines on 3.11 (to place the carets). It leaves a finalized
    cycle every 10 ms, few enough that the collector never starves the parsing thread."""
    litter = 0.0
    while (now := time.monotonic()) < until:
        if now >= litter:
            _Finalized()
            litter = now + 0.01
        try:
            _raise_deep(5)
        except (IndexError, TypeError) as exc:
            traceback.format_exception(exc)
        formatted[0] += 1


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="the shared AST recursion counter is gone")
def test_code_keys_are_read_while_other_threads_format_tracebacks():
    """The library's modules parsed as the code keys parse them, for 2 s, while two threads format
    tracebacks and leave garbage whose finalizers switch threads: no parse may fail."""
    sources = [(str(p), p.read_text()) for p in sorted(ROOT.rglob("*.py"))]
    until = time.monotonic() + 2.0
    formatted: list[int] = [0]
    threads = [threading.Thread(target=_format_tracebacks, args=(until, formatted), daemon=True) for _ in range(2)]
    failed, parsed = [], 0
    for thread in threads:
        thread.start()
    try:
        while time.monotonic() < until and not failed:
            filename, source = sources[parsed % len(sources)]
            try:
                code_keys._parse(source, filename)
            except SystemError as exc:
                failed.append(f"{filename}: {exc}")
            parsed += 1
    finally:
        for thread in threads:
            thread.join(timeout=10)
    assert not failed, f"parse {parsed} failed: {failed[0]}"
    assert formatted[0] > 50 and parsed > 50, (formatted, parsed)
    assert gc.isenabled()


@pytest.fixture
def counted(monkeypatch):
    """The files parsed, by path, since the fixture began."""
    parsed: list[str] = []
    real = code_keys._parse
    monkeypatch.setattr(code_keys, "_parse", lambda source, filename: parsed.append(filename) or real(source, filename))
    return parsed


@pytest.fixture
def fresh_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBODIED_R_HOME", str(tmp_path / "home"))
    code_keys.reread()
    yield tmp_path / "home"
    code_keys.reread()


def test_a_warm_cache_parses_nothing_and_keys_as_a_fresh_read(fresh_home, counted):
    """Every stage of every shipped recipe keyed, and every module hashed, from a cold cache, then
    warm in a fresh read: the same keys and versions, and the second read parses no file."""
    cold = keys(fresh_home), {m: code_keys.module_version(m) for m in library_modules()}
    assert len(set(counted)) == len(library_modules()) and code_keys._cache_file().is_file()
    assert str(code_keys._cache_file()).endswith(f"{sys.implementation.cache_tag}.json")
    code_keys.reread()
    counted.clear()
    assert (keys(fresh_home), {m: code_keys.module_version(m) for m in library_modules()}) == cold
    assert counted == []


def test_a_cache_written_by_another_version_of_the_reader_is_not_read(fresh_home, counted, monkeypatch):
    keys(fresh_home, {"smoke"})
    code_keys.reread()
    counted.clear()
    monkeypatch.setattr(code_keys, "_analyser", lambda: "another")
    keys(fresh_home, {"smoke"})
    assert len(counted) > 50


def test_a_changed_file_is_read_again_and_only_it(fresh_home, counted, tmp_path, monkeypatch):
    """The library copied, keyed warm, then changed on disk: a longer file, one of the same size
    with another mtime, one only touched. Each is parsed again, nothing else, and its version
    moves only where its code did."""
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    monkeypatch.setattr(code_keys, "ROOT", copy)
    code_keys.reread()
    before = {m: code_keys.module_version(m) for m in library_modules()}
    code_keys.reread()
    counted.clear()
    assert {m: code_keys.module_version(m) for m in library_modules()} == before and counted == []

    longer, touched = copy / "progress.py", copy / "paths.py"
    # A module-level number's last digit changed: the same size, other code.
    same_size, line = next((p, line) for p in sorted(copy.glob("*.py")) if p.name != "code_keys.py"
                           for line in p.read_text().splitlines() if re.fullmatch(r"[A-Z_]+ = \d+", line))
    stamp = os.stat(same_size).st_mtime_ns
    longer.write_text(longer.read_text() + "\n_planted = 1\n")
    same_size.write_text(same_size.read_text().replace(line, line[:-1] + str((int(line[-1]) + 1) % 10), 1))
    os.utime(same_size, ns=(stamp + 1_000_000, stamp + 1_000_000))
    os.utime(touched, ns=(stamp + 2_000_000, stamp + 2_000_000))
    code_keys.reread()
    counted.clear()
    after = {m: code_keys.module_version(m) for m in library_modules()}
    assert sorted(counted) == sorted(str(p) for p in (longer, same_size, touched))
    assert {m for m in after if after[m] != before[m]} == {f"{PACKAGE}.progress", f"{PACKAGE}.{same_size.stem}"}


def test_a_home_that_cannot_be_written_keys_the_same(fresh_home, counted):
    """A cache that cannot be kept costs a parse per plan, never a key."""
    fresh_home.mkdir(parents=True)
    (fresh_home / "cache").write_text("a file where the cache folder belongs")
    first = keys(fresh_home, {"smoke"})
    code_keys.reread()
    counted.clear()
    assert keys(fresh_home, {"smoke"}) == first and counted
