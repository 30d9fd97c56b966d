"""Shards: one stage's items split over several runs and merged into one stage folder.

An item's shard is a hash of its id (the same on every run and machine); each shard has its
own folder and resume log beside the stage's (``<stage>.shard-2-of-4``), so only a failed shard redoes work."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from embodied_r.io import is_complete, partial_path, read_summary, stage_folder, write_summary, write_text_atomic

log = logging.getLogger(__name__)

# The stage input that asks a run for one shard only, as "INDEX/COUNT" (INDEX from 1): what a
# flow run of one shard passes to its stage; the merge is a run without it.
SHARD_INPUT = "shard"
LOG_NAME = "items.jsonl"


def shard_of(item_id: str, count: int) -> int:
    """The shard (0-based) of an item: a hash of its id, never its position in a list, so
    adding or removing other items moves no item to another shard."""
    digest = hashlib.sha256(str(item_id).encode()).digest()
    return int.from_bytes(digest[:8], "big") % count


def members(ids: Sequence[str], index: int, count: int) -> list[str]:
    """The ids of shard ``index`` (0-based), in the stage's own order."""
    return [i for i in ids if shard_of(i, count) == index]


def shard_folder(out: Path, index: int, count: int) -> Path:
    """Where shard ``index`` (0-based) of stage folder ``out`` works; people count from 1."""
    out = Path(out)
    return out.with_name(f"{out.name}.shard-{index + 1}-of-{count}")


def parse_selection(text: str | None, count: int) -> int | None:
    """The 0-based shard a ``SHARD_INPUT`` value asks for ("2/4" is the second of four)."""
    if not text:
        return None
    index, _, of = str(text).partition("/")
    try:
        number, total = int(index), int(of)
    except ValueError:
        raise ValueError(f"shard {text!r} is not INDEX/COUNT (for example 2/4)") from None
    if total != count or not 1 <= number <= total:
        raise ValueError(f"shard {text!r} does not fit the recipe's shards: {count}; "
                         f"ask for one of 1/{count} .. {count}/{count}")
    return number - 1


def where() -> str:
    """The machine and process a shard ran in, for the stage's summary."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Sharding:
    """The hooks a stage gives ``run_sharded``. ``work(folder, members)`` does those items in a
    shard's ``.partial`` folder and returns its figures (``done``, ``failed``, what the merge
    needs); ``finish(folder, shard_summaries)`` writes the outputs from the gathered logs and
    returns the stage's summary."""

    ids: list[str]
    work: Callable[[Path, list[str]], dict[str, Any]]
    finish: Callable[[Path, list[dict[str, Any]]], dict[str, Any]]
    # Sub-folders of item files each shard writes (key frames' ``frames``), moved into the
    # stage folder by the merge.
    files: tuple[str, ...] = ()
    # The field naming an entry in the stage's item log, and the entries a shard's members own
    # (the members themselves by default): a new shard starts from its entries in an unsharded
    # run's log (the stage's ``.partial``, left by a run stopped before it was given shards)
    # instead of doing them again. None: not carried over.
    log_key: str | None = None
    log_keys: Callable[[list[str]], set[str]] = set


def run_sharded(out: Path, count: int, sharding: Sharding, only: int | None = None) -> dict[str, Any]:
    """Every unfinished shard of stage ``out`` (or shard ``only``, whose summary is returned
    unmerged), then the merge. The first failure is raised once all shards have been tried."""
    out = Path(out)
    if is_complete(out):
        _remove_shards(out)
        return read_summary(out)
    folders = [shard_folder(out, i, count) for i in range(count)]
    if only is not None:
        return _run_shard(folders[only], only, count, sharding, partial_path(out))
    failures: list[tuple[int, BaseException]] = []
    for index, folder in enumerate(folders):
        try:
            _run_shard(folder, index, count, sharding, partial_path(out))
        except Exception as exc:  # noqa: BLE001 - the other shards still run; raised below
            log.warning("shard %d of %d of %s failed: %s", index + 1, count, out.name, exc)
            failures.append((index, exc))
    if failures:
        index, exc = failures[0]
        others = f" (and shards {', '.join(str(i + 1) for i, _ in failures[1:])})" if len(failures) > 1 else ""
        exc.add_note(f"shard {index + 1} of {count}{others} of {out.name} did not finish; the finished shards "
                     "are kept and a rerun does only the others")
        raise exc
    return merge(out, count, sharding)


def _run_shard(folder: Path, index: int, count: int, sharding: Sharding, unsharded: Path) -> dict[str, Any]:
    if is_complete(folder):
        return read_summary(folder)
    mine = members(sharding.ids, index, count)
    start = time.monotonic()
    with stage_folder(folder) as work:
        if is_complete(folder):  # another run of this shard finished it while this one waited
            return read_summary(folder)
        if sharding.log_key is not None and not (work / LOG_NAME).exists():
            _seed(work / LOG_NAME, unsharded / LOG_NAME, sharding.log_key, sharding.log_keys(mine))
        figures = sharding.work(work, mine)
        summary = {"shard": index + 1, "of": count, "items": len(mine), "where": where(),
                   "seconds": round(time.monotonic() - start, 3), **figures}
        write_summary(work, summary)
    return summary


def merge(out: Path, count: int, sharding: Sharding) -> dict[str, Any]:
    """The finished shards gathered into ``out``, one rename when all is written. When the stage's
    checks fail, shards with failed items are reopened so a rerun tries them again."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    folders = [shard_folder(out, i, count) for i in range(count)]
    missing = [i + 1 for i, f in enumerate(folders) if not is_complete(f)]
    if missing:
        raise RuntimeError(f"{out.name}: shards {missing} of {count} have not finished; run them first")
    summaries = [read_summary(f) for f in folders]
    try:
        with stage_folder(out) as work:
            if is_complete(out):  # merged by another run while this one waited
                return read_summary(out)
            _gather_logs(work, folders)
            for sub in sharding.files:
                for folder in folders:
                    _move_entries(folder / sub, work / sub)
            summary = sharding.finish(work, summaries)
            summary["shards"] = shard_table(summaries)
            write_summary(work, summary)
    except Exception:
        for folder, shard in zip(folders, summaries):
            if shard.get("failed"):
                _reopen(folder)
        raise
    _remove_shards(out)
    return summary


def shard_table(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """How many shards ran where, and each shard's counts (MLflow metrics ``shards/<n>/...``)."""
    table: dict[str, Any] = {"count": len(summaries),
                             "hosts": dict(Counter(str(s.get("where", "?")).rsplit(":", 1)[0] for s in summaries))}
    for s in summaries:
        table[str(s["shard"])] = {k: s[k] for k in ("items", "done", "failed", "seconds", "where") if k in s}
    return table


def summed(summaries: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """Per-run counters of the shards added up, as one run would have counted them."""
    return {k: sum(s.get(k, 0) for s in summaries) for k in keys}


def _gather_logs(work: Path, folders: list[Path]) -> None:
    """The shards' logs as the stage's one log (written aside, then renamed: a crash here
    leaves the shards' logs untouched and the merge is simply done again)."""
    def lines() -> Iterator[str]:
        for folder in folders:
            path = folder / LOG_NAME
            if path.is_file():
                for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
                    if line.endswith("\n"):
                        yield line

    write_text_atomic(work / LOG_NAME, lines())


def _seed(log: Path, source: Path, key: str, own: set[str]) -> None:
    """A new shard's log started with the entries of ``source`` whose ``key`` it owns."""
    if not source.is_file():
        return
    kept = []
    for line in source.read_text(encoding="utf-8").splitlines(keepends=True):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line: that item is done again
        if line.endswith("\n") and isinstance(entry, dict) and str(entry.get(key)) in own:
            kept.append(line)
    if kept:
        write_text_atomic(log, "".join(kept))


def _move_entries(src: Path, dst: Path) -> None:
    """Each entry of ``src`` moved into ``dst`` (a repeated merge finds them moved already)."""
    if not src.is_dir():
        return
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        target = dst / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(entry, target)


def _reopen(folder: Path) -> None:
    """A finished shard made unfinished again: its log is kept, its summary dropped."""
    work = partial_path(folder)
    if work.exists() or not folder.is_dir():
        return
    (folder / "summary.json").unlink(missing_ok=True)
    os.replace(folder, work)


def shard_paths(out: Path) -> list[Path]:
    """Every shard folder of stage ``out`` whatever its count, finished or not, with their
    locks: what discarding the stage must discard too, or a refresh would merge them again."""
    out = Path(out)
    return sorted(out.parent.glob(f"{out.name}.shard-*-of-*")) if out.parent.is_dir() else []


def _remove_shards(out: Path) -> None:
    """The shards' folders once merged (and those of another count, left by a changed recipe)."""
    for path in shard_paths(out):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
