"""EgoSchema, evaluation-only: the 500 questions whose answers are public (lmms-lab/egoschema's
``Subset``), five options and the answer the right one's index; one task, each clip its own scene."""

from __future__ import annotations

from pathlib import Path

from embodied_r.benchmarks.base import (Benchmark, Keep, VideoIndex, failure, first_line, lettered_options,
                                        missing_field, read_checked, unique_ids)
from embodied_r.errors import DataSourceError

NAME = "egoschema"
# The other 4,531 of its 5,031 questions are scored only by the benchmark's own server, so they
# are neither fetched nor evaluated here.
FILE = "Subset/test-00000-of-00001.parquet"
TASK = "egoschema_subset"  # its category: the subset has no task types
# Five archives (about 21 GB each) hold all 5,031 clips and the subset's 500 lie across them.
ZIPS = "videos_chunked_*.zip"
# Read as text whatever the file stores them as (``question_idx`` and ``answer`` are cast).
COLUMNS = (("question_idx", "string"), ("question", "string"), ("video_idx", "string"),
           ("option", "list<string>"), ("answer", "string"))


def answer_letter(answer: object, n_options: int) -> str | None:
    """The answer is the right option's 0-based index; None when it is no option's."""
    text = "" if answer is None else str(answer).strip()
    if text.isdigit() and int(text) < n_options:
        return chr(65 + int(text))
    return None


def read(base: Path, failures: list[dict], keep: Keep) -> list[dict]:
    if not keep(TASK):
        return []
    index = VideoIndex(base / "videos")
    rows = []
    for r in read_checked(base / FILE, COLUMNS):
        uid = f"{NAME}:{r['question_idx']}"
        if why := missing_field(r, ("question_idx", "question", "video_idx")):
            failures.append(failure(uid, why))
            continue
        if r["answer"] is None or not str(r["answer"]).strip():
            failures.append(failure(uid, "answer_unknown: the question has no public answer, so it cannot be "
                                         f"scored; only {FILE} (answers public) is evaluated"))
            continue
        options = lettered_options(r["option"])
        answer = answer_letter(r["answer"], len(options))
        if answer is None:
            failures.append(failure(uid, f"answer_not_an_option: answer {r['answer']!r} is not the 0-based index of "
                                         f"one of its {len(options)} options"))
            continue
        video = str(r["video_idx"]).strip()
        if Path(video).name != video:
            failures.append(failure(uid, f"path_outside_benchmark: video {video!r} is a path, not a clip id; the row "
                                         "is left out (fix its video_idx in the source)"))
            continue
        path, refused = index.place(f"{video}.mp4", uid)
        if refused:
            failures.append(refused)
            continue
        rows.append({
            "uid": uid, "benchmark": NAME, "original_id": str(r["question_idx"]),
            "video_id": f"{NAME}/{video}", "video_path": path, "scene": video,
            "category": TASK, "question": " ".join(str(r["question"]).split()),
            "options": options, "answer": answer, "answer_type": "choice",
        })
    unique_ids(rows, base / FILE)
    return rows


def videos(base: Path) -> dict[str, set[str]]:
    import pyarrow.parquet as pq

    path = base / FILE
    try:
        ids = pq.read_table(path, columns=["video_idx"]).column(0).to_pylist()
    except Exception as exc:  # noqa: BLE001 - any unreadable file: the same fix
        raise DataSourceError(f"{path}: cannot be read to choose the clips to extract ({first_line(exc)}); "
                              "download it again") from None
    return {ZIPS: {f"{str(v).strip()}.mp4".lower() for v in ids if v is not None}}


# Asked at main, resolved and recorded at the first download (its head carried the fifth
# archive, "add 05", commit 5835052...).
BENCHMARK = Benchmark(NAME, "EgoSchema", FILE, "lmms-lab/egoschema", "main", allow_patterns=[FILE, ZIPS],
                      read=read, tasks=(TASK,), archives={ZIPS: ""}, videos=videos, evaluation_only=True)
