"""What the benchmark modules share: the declaration ``Benchmark``, the splits, the source
errors, and the checks of reading a source into catalog rows (a bad file stops the catalog with
one line naming it and the fix; a bad row is that row's failure, a ``schemas.FAILURES`` dict)."""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, get_args

from embodied_r.errors import CatalogError

# The scene-disjoint splits of the training benchmarks, and the split of the evaluation-only ones.
SPLITS = ("train", "val", "test")
OOD = "ood"
Split = Literal["train", "val", "test", "ood"]
ALL_SPLITS: tuple[str, ...] = get_args(Split)

Keep = Callable[[str], bool]  # whether the catalog keeps a task


@dataclass(frozen=True)
class Benchmark:
    name: str
    folder: str  # in a download or a mirror, laid out as its hub repo
    question_file: str  # whose presence says a source holds the benchmark
    repo: str  # on the Hugging Face Hub, and the revision asked for by default
    revision: str
    allow_patterns: list[str]  # the files it needs, ``fnmatch`` patterns as huggingface_hub applies them
    # Its folder into catalog rows (less ``split``, ``fold``, ``fact``), each bad row's failure appended.
    read: Callable[[Path, list[dict], Keep], list[dict]]
    tasks: tuple[str, ...]  # what ``catalog.tasks: paper`` keeps
    archives: dict[str, str] = field(default_factory=dict)  # video archive pattern -> folder under videos/
    # Per archive pattern, the lower-case names of the videos its questions use; None: every video.
    videos: Callable[[Path], dict[str, set[str]]] | None = None
    evaluation_only: bool = False  # never trained on: every question is in the ``ood`` split
    synthetic: str | None = None  # ``module:function`` writing its synthetic twin


def arrow_schema(columns: tuple[tuple[str, str], ...]):
    """``(name, type)`` pairs ("int64", "list<string>") in pyarrow's terms."""
    import pyarrow as pa

    def of(kind: str):
        return pa.list_(of(kind[5:-1])) if kind.startswith("list<") else pa.type_for_alias(kind)

    return pa.schema([(name, of(kind)) for name, kind in columns])


def read_checked(path: Path, columns: tuple[tuple[str, str], ...]) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    expected = arrow_schema(columns)
    if not path.is_file():
        raise CatalogError(f"{path} not found: run the download stage first (embodied-r download)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise CatalogError(f"{path}: not a readable Parquet file ({first_line(exc)}); download it again") from None
    missing = [n for n in expected.names if n not in table.column_names]
    if missing:
        raise CatalogError(f"{path}: missing column(s) {', '.join(missing)}; expected {expected.names}")
    out = []
    for f in expected:
        column = table.column(f.name)
        try:
            out.append(column.cast(f.type))
        except (pa.ArrowException, ValueError) as exc:
            raise CatalogError(f"{path}: column {f.name!r} holds {column.type}, which cannot be read as "
                               f"{f.type} ({first_line(exc)})") from None
    return pa.table(out, names=expected.names).to_pylist()


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
    """The failure of a row whose video path leaves its benchmark folder, or None; judged as
    written, not resolved: a mirror's videos may be links to elsewhere."""
    folder = os.path.normpath(base)
    path = os.path.normpath(os.path.join(folder, "videos", relative))
    if os.path.commonpath([folder, path]) == folder:
        return None
    return failure(uid, f"path_outside_benchmark: video {video_id!r} leaves {base}, so it is not read; the row is "
                        "left out (fix its video id in the source to a path inside the benchmark folder)")


class VideoIndex:
    """Files by lower-case name, to find a video whatever folders its archive wrapped it in."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.by_name: dict[str, list[Path]] = {}
        if self.folder.is_dir():
            for path in sorted(self.folder.rglob("*")):
                if path.is_file():
                    self.by_name.setdefault(path.name.lower(), []).append(path)

    def find(self, relative: str) -> tuple[Path | None, int]:
        tail = "/" + relative.lower().lstrip("/")
        hits = [p for p in self.by_name.get(Path(relative).name.lower(), [])
                if ("/" + p.relative_to(self.folder).as_posix().lower()).endswith(tail)]
        return (hits[0] if len(hits) == 1 else None), len(hits)

    def place(self, relative: str, uid: str) -> tuple[str, dict | None]:
        """Where a row's video is (or would be), or the row's failure when several files match."""
        found, n = self.find(relative)
        if n > 1:
            return "", failure(uid, f"video_ambiguous: {n} files under {self.folder} end with {relative!r}; the "
                                    "row is left out (keep one copy of the video)")
        return str((found or self.folder / relative).resolve()), None


def lettered_options(options: list[str] | None) -> list[str]:
    """``["A. ...", "B. ...", ...]``; a marker an option already carries is not repeated."""
    out = []
    for i, opt in enumerate(options or []):
        letter = chr(65 + i)
        text = re.sub(rf"^\(?{letter}[.):]\s*", "", " ".join(str(opt).split()))
        out.append(f"{letter}. {text}")
    return out


def question_block(template: str, question: str, options: list[str] | tuple[str, ...] | None) -> str:
    """``template`` holds ``{question}`` and ``{options}``; stripped, as the original code did."""
    lines = [str(o).strip() for o in options or [] if o and str(o).strip()]
    return template.format(question=(question or "").strip(), options="\n".join(lines)).strip()
