"""The evaluation-only benchmarks, read into catalog rows: EgoSchema's subset with public
answers and MVBench's task files (``benchmark_rules`` declares which and why).

Both become the lettered multiple choice the rest of the pipeline reads: options
``"A. ..."`` in their given order and the answer as a letter (EgoSchema's answer is the right
option's index, MVBench's the right candidate's text). Their rows are never split: the
catalog puts every one in the ``ood`` split. Videos come out of the benchmarks' archives
(``download`` extracts only the ones these questions need) and are found by file name under
the benchmark's ``videos/`` folder, whatever folders the archive wraps them in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq

from embodied_r import benchmark_rules as bm
from embodied_r import schemas
from embodied_r.benchmark_rules import DataSourceError
from embodied_r.data.rows import CatalogError, failure, first_line, missing_field, read_checked, unique_ids

# Keys of an MVBench task file's entries (a JSON list of objects).
MVBENCH_KEYS = ("video", "question", "candidates", "answer")
# Entries with these ask about a stretch of their video; key frames are taken from whole videos.
MVBENCH_SEGMENT_KEYS = ("start", "end")

Keep = Callable[[str], bool]


class VideoIndex:
    """The files under a folder by lower-case name, to find a video whatever folders its
    archive wrapped it in."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.by_name: dict[str, list[Path]] = {}
        if self.folder.is_dir():
            for path in sorted(self.folder.rglob("*")):
                if path.is_file():
                    self.by_name.setdefault(path.name.lower(), []).append(path)

    def find(self, relative: str) -> tuple[Path | None, int]:
        """The one file whose path ends with ``relative`` (case aside), and how many did."""
        tail = "/" + relative.lower().lstrip("/")
        hits = [p for p in self.by_name.get(Path(relative).name.lower(), [])
                if ("/" + p.relative_to(self.folder).as_posix().lower()).endswith(tail)]
        return (hits[0] if len(hits) == 1 else None), len(hits)


def _place(index: VideoIndex, relative: str, uid: str) -> tuple[str, dict | None]:
    """Where a row's video is (its expected place when absent, for the catalog's
    video_missing line), or the row's failure when several files match."""
    found, n = index.find(relative)
    if n > 1:
        return "", failure(uid, f"video_ambiguous: {n} files under {index.folder} end with {relative!r}; the row "
                                "is left out (keep one copy of the video)")
    return str((found or index.folder / relative).resolve()), None


def egoschema_rows(root: Path, failures: list[dict], keep: Keep) -> list[dict]:
    """EgoSchema's subset: five options, the answer an index; one task, every clip its own scene."""
    base = root / bm.EGOSCHEMA_DIR
    if not keep(bm.EGOSCHEMA_TASK):
        return []
    index = VideoIndex(base / "videos")
    rows = []
    for r in read_checked(base / bm.EGOSCHEMA_FILE, schemas.EGOSCHEMA_SUBSET):
        uid = f"{bm.EGOSCHEMA}:{r['question_idx']}"
        if why := missing_field(r, ("question_idx", "question", "video_idx")):
            failures.append(failure(uid, why))
            continue
        if r["answer"] is None or not str(r["answer"]).strip():
            # The full set's answers are withheld (its server scores them): nothing to score here.
            failures.append(failure(uid, "answer_unknown: the question has no public answer, so it cannot be "
                                         f"scored; only {bm.EGOSCHEMA_FILE} (answers public) is evaluated"))
            continue
        options = bm.lettered_options(r["option"])
        answer = bm.egoschema_answer_letter(r["answer"], len(options))
        if answer is None:
            failures.append(failure(uid, f"answer_not_an_option: answer {r['answer']!r} is not the 0-based index of "
                                         f"one of its {len(options)} options"))
            continue
        video = str(r["video_idx"]).strip()
        if Path(video).name != video:
            failures.append(failure(uid, f"path_outside_benchmark: video {video!r} is a path, not a clip id; the row "
                                         "is left out (fix its video_idx in the source)"))
            continue
        path, refused = _place(index, f"{video}.mp4", uid)
        if refused:
            failures.append(refused)
            continue
        rows.append({
            "uid": uid, "benchmark": bm.EGOSCHEMA, "original_id": str(r["question_idx"]),
            "video_id": f"{bm.EGOSCHEMA}/{video}", "video_path": path, "scene": video,
            "category": bm.EGOSCHEMA_TASK, "question": " ".join(str(r["question"]).split()),
            "options": options, "answer": answer, "answer_type": "choice", "fact": "",
        })
    unique_ids(rows, base / bm.EGOSCHEMA_FILE)
    return rows


def _task_items(path: Path) -> list:
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CatalogError(f"{path}: not a readable JSON task file ({first_line(exc)}); download it again") from None
    if not isinstance(items, list):
        raise CatalogError(f"{path}: holds a {type(items).__name__}, not the list of questions MVBench's task "
                           "files hold; download it again")
    return items


def mvbench_rows(root: Path, failures: list[dict], keep: Keep) -> list[dict]:
    """MVBench's task files kept by ``keep``: candidates in their order, the answer a
    candidate's text. A question's id is its task and its place in the task's file."""
    base = root / bm.MVBENCH_DIR
    rows = []
    for path in sorted(base.glob(bm.MVBENCH_JSON.format(task="*"))):
        task = path.stem
        if not keep(task):
            continue
        archive = bm.MVBENCH_EGOCENTRIC.get(task)
        # A task whose archive is not declared has no videos here: its rows end as video_missing.
        index = VideoIndex(base / "videos" / (Path(archive).stem if archive else task))
        for i, item in enumerate(_task_items(path)):
            uid = f"{bm.MVBENCH}:{task}:{i}"
            if not isinstance(item, dict):
                failures.append(failure(uid, f"missing_field: entry is a {type(item).__name__}, not an object"))
                continue
            if why := missing_field(item, MVBENCH_KEYS):
                failures.append(failure(uid, why))
                continue
            if any(item.get(k) is not None for k in MVBENCH_SEGMENT_KEYS):
                failures.append(failure(uid, f"segment_unsupported: the question is about seconds {item.get('start')}"
                                             f"-{item.get('end')} of its video, and key frames are taken from whole "
                                             "videos; the row is left out (choose a task without start/end)"))
                continue
            candidates = [str(c) for c in item["candidates"]] if isinstance(item["candidates"], list) else []
            answer = bm.mvbench_answer_letter(item["answer"], candidates)
            if answer is None:
                failures.append(failure(uid, f"answer_not_an_option: answer {item['answer']!r} is not exactly one of "
                                             f"the candidates {candidates}"))
                continue
            video = str(item["video"]).strip()
            if Path(video).is_absolute() or ".." in Path(video).parts:
                failures.append(failure(uid, f"path_outside_benchmark: video {video!r} leaves {base}, so it is not "
                                             "read; the row is left out (fix its video in the task file)"))
                continue
            place, refused = _place(index, video, uid)
            if refused:
                failures.append(refused)
                continue
            rows.append({
                "uid": uid, "benchmark": bm.MVBENCH, "original_id": f"{task}:{i}",
                "video_id": f"{bm.MVBENCH}/{index.folder.name}/{video}", "video_path": place,
                "scene": f"{index.folder.name}/{video}", "category": task,
                "question": " ".join(str(item["question"]).split()), "options": bm.lettered_options(candidates),
                "answer": answer, "answer_type": "choice", "fact": "",
            })
    return rows


READERS: dict[str, Callable[[Path, list[dict], Keep], list[dict]]] = {
    bm.EGOSCHEMA: egoschema_rows, bm.MVBENCH: mvbench_rows}


def video_names(base: Path, benchmark: str) -> dict[str, set[str]] | None:
    """Per archive pattern of ``bm.VIDEO_ARCHIVES``, the lower-case file names of the videos
    the benchmark's questions use (what the download stage extracts); None: every video."""
    if benchmark == bm.EGOSCHEMA:
        path = base / bm.EGOSCHEMA_FILE
        try:
            ids = pq.read_table(path, columns=["video_idx"]).column(0).to_pylist()
        except Exception as exc:  # noqa: BLE001 - any unreadable file: the same fix
            raise DataSourceError(f"{path}: cannot be read to choose the clips to extract ({first_line(exc)}); "
                                  "download it again") from None
        return {bm.EGOSCHEMA_ZIPS: {f"{str(v).strip()}.mp4".lower() for v in ids if v is not None}}
    if benchmark == bm.MVBENCH:
        names: dict[str, set[str]] = {}
        for task, archive in bm.MVBENCH_EGOCENTRIC.items():
            path = base / bm.MVBENCH_JSON.format(task=task)
            try:
                items = _task_items(path) if path.is_file() else []
            except CatalogError as exc:
                raise DataSourceError(str(exc)) from None
            names.setdefault(archive, set()).update(
                Path(str(it["video"])).name.lower() for it in items if isinstance(it, dict) and it.get("video"))
        return names
    return None
