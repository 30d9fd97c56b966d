"""Relocate a copied or moved home: every text value naming the old home, alone or as a path
prefix (plain or ``file://``), in its Parquet, JSON, DuckDB and SQLite files is rewritten. The
marker is updated last, so an interrupted relocation can simply be run again."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from embodied_r.io import SUMMARY_FILE, update_outputs, write_parquet_atomic, write_text_atomic
from embodied_r.paths import HOME_MARKER

TEXT_SUFFIXES = {".json", ".jsonl"}


def _replacer(old: str, new: str) -> Callable[[str], str]:
    pairs = [(f"file://{old}/", f"file://{new}/"), (f"{old}/", f"{new}/")]

    def replace(text: str) -> str:
        if text == old:
            return new
        if text == f"file://{old}":
            return f"file://{new}"
        for a, b in pairs:
            text = text.replace(a, b)
        return text

    return replace


def _rewrite_array(array: pa.Array, replace: Callable[[str], str]) -> pa.Array:
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return pa.array([None if v is None else replace(v) for v in array.to_pylist()], type=array.type)
    if pa.types.is_list(array.type) and pa.types.is_string(array.type.value_type):
        return pa.array([None if v is None else [None if x is None else replace(x) for x in v]
                         for v in array.to_pylist()], type=array.type)
    return array


def _rewrite_parquet(path: Path, replace: Callable[[str], str]) -> bool:
    table = pq.read_table(path)
    columns = [_rewrite_array(col.combine_chunks(), replace) for col in table.columns]
    new = pa.Table.from_arrays(columns, schema=table.schema)
    if new.equals(table):
        return False
    write_parquet_atomic(new, path)
    return True


def _rewrite_text(path: Path, old: str, new: str) -> bool:
    text = path.read_text(encoding="utf-8")
    if old not in text:
        return False
    # JSON values hold the path as written, so a plain prefix rewrite keeps them valid.
    write_text_atomic(path, text.replace(f"{old}/", f"{new}/").replace(f'"{old}"', f'"{new}"'))
    return True


def _rewrite_sqlite(path: Path, old: str, new: str) -> int:
    changed = 0
    with sqlite3.connect(path) as con:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            columns = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')
                       if (r[2] or "").upper().startswith(("TEXT", "VARCHAR", "CHAR"))]
            for column in columns:
                cur = con.execute(
                    f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) WHERE instr("{column}", ?) > 0',
                    (f"{old}/", f"{new}/", f"{old}/"))
                changed += cur.rowcount
                for a, b in ((old, new), (f"file://{old}", f"file://{new}")):
                    changed += con.execute(f'UPDATE "{table}" SET "{column}" = ? WHERE "{column}" = ?',
                                           (b, a)).rowcount
    return changed


def _rewrite_duckdb(path: Path, replace: Callable[[str], str]) -> int:
    import duckdb

    changed = 0
    with duckdb.connect(str(path)) as con:
        tables = con.execute("SELECT table_name FROM information_schema.tables "
                             "WHERE table_type = 'BASE TABLE'").fetchall()
        for (table,) in tables:
            cols = con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                               "AND data_type = 'VARCHAR'", [table]).fetchall()
            for (col,) in cols:
                values = con.execute(f'SELECT DISTINCT "{col}" FROM "{table}" WHERE "{col}" IS NOT NULL').fetchall()
                for (value,) in values:
                    if (fixed := replace(value)) != value:
                        con.execute(f'UPDATE "{table}" SET "{col}" = ? WHERE "{col}" = ?', [fixed, value])
                        changed += 1
    return changed


def _record_sizes_again(root: Path, changed: list[Path]) -> None:
    """A finished stage records its files' sizes to find one lost later: rewritten files are
    recorded again, so the stage stays done."""
    folders: dict[Path, list[Path]] = {}
    for path in changed:
        for parent in path.parents:
            if parent == root:
                break
            if (parent / SUMMARY_FILE).is_file():
                if path.name != SUMMARY_FILE or path.parent != parent:
                    folders.setdefault(parent, []).append(path)
                break
    for folder, paths in folders.items():
        update_outputs(folder, paths)


def relocate_home(root: Path) -> dict[str, Any]:
    root = Path(root).resolve()
    marker = root / HOME_MARKER
    if not marker.is_file():
        raise FileNotFoundError(f"{root} has no {HOME_MARKER}: it is not a project home, or was never used")
    old = json.loads(marker.read_text())["path"]
    new = str(root)
    counts = {"from": old, "to": new, "parquet": 0, "text": 0, "duckdb": 0, "sqlite": 0}
    if old != new:
        replace = _replacer(old, new)
        changed: list[Path] = []
        for path in sorted(root.rglob("*")):
            if not path.is_file() or path.name.startswith("."):
                continue
            done = 0
            if path.suffix == ".parquet":
                counts["parquet"] += (done := _rewrite_parquet(path, replace))
            elif path.suffix in TEXT_SUFFIXES:
                counts["text"] += (done := _rewrite_text(path, old, new))
            elif path.suffix == ".duckdb":
                counts["duckdb"] += (done := _rewrite_duckdb(path, replace))
            elif path.suffix == ".db":
                counts["sqlite"] += _rewrite_sqlite(path, old, new)
            if done:
                changed.append(path)
        _record_sizes_again(root, changed)
    write_text_atomic(marker, json.dumps({"path": new}))
    return counts
