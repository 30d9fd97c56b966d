"""MVBench, evaluation-only: its egocentric tasks' JSON files, candidates in their order and the
answer the right candidate's text; a question's id is its task and its place in the task's file."""

from __future__ import annotations

import json
from pathlib import Path

from embodied_r.benchmarks.base import Benchmark, Keep, VideoIndex, failure, first_line, lettered_options, missing_field
from embodied_r.errors import CatalogError, DataSourceError

NAME = "mvbench"
# Of its 20 tasks only egocentric_navigation is seen from the moving agent's own camera
# (docs/ood-benchmarks.md); a task and its archive added here is downloaded and evaluated.
EGOCENTRIC = {"egocentric_navigation": "video/vlnqa.zip"}
JSON = "json/{task}.json"
ARCHIVES = sorted(set(EGOCENTRIC.values()))
KEYS = ("video", "question", "candidates", "answer")
# Entries with these ask about a stretch of their video; key frames are taken from whole videos.
SEGMENT_KEYS = ("start", "end")


def answer_letter(answer: object, candidates: list[str]) -> str | None:
    """The answer is the right candidate's text; None when it matches none or several."""
    hits = [i for i, c in enumerate(candidates) if " ".join(str(c).split()) == " ".join(str(answer).split())]
    return chr(65 + hits[0]) if len(hits) == 1 else None


def _task_items(path: Path) -> list:
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CatalogError(f"{path}: not a readable JSON task file ({first_line(exc)}); download it again") from None
    if not isinstance(items, list):
        raise CatalogError(f"{path}: holds a {type(items).__name__}, not the list of questions MVBench's task "
                           "files hold; download it again")
    return items


def read(base: Path, failures: list[dict], keep: Keep) -> list[dict]:
    rows = []
    for path in sorted(base.glob(JSON.format(task="*"))):
        task = path.stem
        if not keep(task):
            continue
        archive = EGOCENTRIC.get(task)
        # A task whose archive is not declared has no videos here: its rows end as video_missing.
        index = VideoIndex(base / "videos" / (Path(archive).stem if archive else task))
        for i, item in enumerate(_task_items(path)):
            uid = f"{NAME}:{task}:{i}"
            if not isinstance(item, dict):
                failures.append(failure(uid, f"missing_field: entry is a {type(item).__name__}, not an object"))
                continue
            if why := missing_field(item, KEYS):
                failures.append(failure(uid, why))
                continue
            if any(item.get(k) is not None for k in SEGMENT_KEYS):
                failures.append(failure(uid, f"segment_unsupported: the question is about seconds {item.get('start')}"
                                             f"-{item.get('end')} of its video, and key frames are taken from whole "
                                             "videos; the row is left out (choose a task without start/end)"))
                continue
            candidates = [str(c) for c in item["candidates"]] if isinstance(item["candidates"], list) else []
            answer = answer_letter(item["answer"], candidates)
            if answer is None:
                failures.append(failure(uid, f"answer_not_an_option: answer {item['answer']!r} is not exactly one of "
                                             f"the candidates {candidates}"))
                continue
            video = str(item["video"]).strip()
            if Path(video).is_absolute() or ".." in Path(video).parts:
                failures.append(failure(uid, f"path_outside_benchmark: video {video!r} leaves {base}, so it is not "
                                             "read; the row is left out (fix its video in the task file)"))
                continue
            place, refused = index.place(video, uid)
            if refused:
                failures.append(refused)
                continue
            rows.append({
                "uid": uid, "benchmark": NAME, "original_id": f"{task}:{i}",
                "video_id": f"{NAME}/{index.folder.name}/{video}", "video_path": place,
                "scene": f"{index.folder.name}/{video}", "category": task,
                "question": " ".join(str(item["question"]).split()), "options": lettered_options(candidates),
                "answer": answer, "answer_type": "choice",
            })
    return rows


def videos(base: Path) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for task, archive in EGOCENTRIC.items():
        path = base / JSON.format(task=task)
        try:
            items = _task_items(path) if path.is_file() else []
        except CatalogError as exc:
            raise DataSourceError(str(exc)) from None
        names.setdefault(archive, set()).update(
            Path(str(it["video"])).name.lower() for it in items if isinstance(it, dict) and it.get("video"))
    return names


# Every task file is fetched (so a task named in ``catalog.tasks`` is known), the archives only
# for the egocentric tasks.
BENCHMARK = Benchmark(NAME, "MVBench", JSON.format(task=next(iter(EGOCENTRIC))), "OpenGVLab/MVBench",
                      "230a2d4fac8900333c61754641c7a13e069ac9c6", allow_patterns=[JSON.format(task="*"), *ARCHIVES],
                      read=read, tasks=tuple(EGOCENTRIC), archives={a: Path(a).stem for a in ARCHIVES},
                      videos=videos, evaluation_only=True)
