"""Reading a benchmark's source file into catalog rows: the checks every benchmark shares.

A file that cannot be read or lacks the benchmark's columns stops the preprocess stage with
one line naming the file and the fix; one row's bad value is that row's failure (a dict of
``schemas.FAILURES``) and the others go on.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


class CatalogError(ValueError):
    """A source file without the benchmark's schema, or a task the source does not have."""


def read_checked(path: Path, expected: pa.Schema) -> list[dict]:
    """The rows of a Parquet source file with ``expected``'s columns, cast to its types."""
    if not path.is_file():
        raise CatalogError(f"{path} not found: run the download stage first (embodied-r download)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise CatalogError(f"{path}: not a readable Parquet file ({first_line(exc)}); download it again") from None
    missing = [n for n in expected.names if n not in table.column_names]
    if missing:
        raise CatalogError(f"{path}: missing column(s) {', '.join(missing)}; expected {expected.names}")
    columns = []
    for field in expected:
        column = table.column(field.name)
        try:
            columns.append(column.cast(field.type))
        except (pa.ArrowException, ValueError) as exc:
            raise CatalogError(f"{path}: column {field.name!r} holds {column.type}, which cannot be read as "
                               f"{field.type} ({first_line(exc)})") from None
    return pa.table(columns, names=expected.names).to_pylist()


def first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def unique_ids(rows: list[dict], path: Path) -> None:
    """Two questions under one id would share every later stage's per-item record."""
    seen: Counter[str] = Counter(r["uid"] for r in rows)
    dup = sorted(uid for uid, n in seen.items() if n > 1)
    if dup:
        shown = ", ".join(dup[:10]) + (f" and {len(dup) - 10} more" if len(dup) > 10 else "")
        raise CatalogError(f"{path}: duplicate question ids {shown}; each id must occur once (fix the file "
                           "or take a fresh copy)")


def missing_field(r: dict, fields: tuple[str, ...]) -> str | None:
    empty = [f for f in fields if r.get(f) is None or (isinstance(r.get(f), str) and not r[f].strip())]
    return f"missing_field: {', '.join(empty)} is empty" if empty else None


def failure(uid: str, reason: str) -> dict:
    return {"stage": "preprocess", "item": uid, "reason": reason}


def outside(base: Path, uid: str, video_id: str, relative: str) -> dict | None:
    """The failure of a row whose video path leaves its benchmark folder (``..``, an absolute
    path), or None. Judged on the path as written, not as resolved: a mirror's videos may be
    links to elsewhere, and those are the user's own."""
    folder = os.path.normpath(base)
    path = os.path.normpath(os.path.join(folder, "videos", relative))
    if os.path.commonpath([folder, path]) == folder:
        return None
    return failure(uid, f"path_outside_benchmark: video {video_id!r} leaves {base}, so it is not read; the row is "
                        "left out (fix its video id in the source to a path inside the benchmark folder)")
