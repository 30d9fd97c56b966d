"""VSI-Bench: room scans' questions, multiple choice or numeric; its task names (the three
relative-direction subtypes are one), its numeric tasks, the paper's tasks and its synthetic twin."""

from __future__ import annotations

import re
from pathlib import Path

from embodied_r.benchmarks.base import Benchmark, Keep, failure, missing_field, outside, read_checked, unique_ids

NAME = "vsibench"
FILE = "test-00000-of-00001.parquet"
DATASETS = ("arkitscenes", "scannet", "scannetpp")  # one video archive each
ZIPS = [f"{d}.zip" for d in DATASETS]
COLUMNS = (("id", "int64"), ("dataset", "string"), ("scene_name", "string"), ("question_type", "string"),
           ("question", "string"), ("options", "list<string>"), ("ground_truth", "string"))
PAPER_TASKS = ("object_rel_direction", "object_rel_distance", "route_planning", "obj_appearance_order")
# Question types that score by mean relative accuracy.
NUMERIC = {"object_counting", "object_abs_distance", "object_size_estimation", "room_size_estimation"}

_REL_DIRECTION = re.compile(r"^object_rel_direction(_(easy|medium|hard))?$")


def category(question_type: str) -> str:
    """The three relative-direction subtypes are one task, as the paper reports them."""
    return "object_rel_direction" if _REL_DIRECTION.match(question_type) else question_type


def normalise_options(options: list[str] | None) -> list[str]:
    spaced = [" ".join(str(opt).split()) for opt in options or []]
    return [opt if re.match(rf"^{chr(65 + i)}[.)]\s*", opt) else f"{chr(65 + i)}. {opt}" for i, opt in enumerate(spaced)]


def read(base: Path, failures: list[dict], keep: Keep | None = None) -> list[dict]:
    rows = []
    for r in read_checked(base / FILE, COLUMNS):
        uid = f"{NAME}:{r['id']}"
        if why := missing_field(r, ("id", "dataset", "scene_name", "question_type", "question", "ground_truth")):
            failures.append(failure(uid, why))
            continue
        numeric = r["question_type"] in NUMERIC or not r["options"]
        options = [] if numeric else normalise_options(r["options"])
        answer = str(r["ground_truth"]).strip()
        if not numeric and answer.upper()[:1] not in [o[0] for o in options]:
            failures.append(failure(uid, f"answer_not_an_option: ground_truth {answer!r} is not one of the options "
                                         f"{[o[0] for o in options]}"))
            continue
        video_id = f"{r['dataset']}/{r['scene_name']}"
        if refused := outside(base, uid, video_id, f"{video_id}.mp4"):
            failures.append(refused)
            continue
        rows.append({
            "uid": uid, "benchmark": NAME, "original_id": str(r["id"]), "video_id": video_id,
            "video_path": str((base / "videos" / f"{video_id}.mp4").resolve()), "scene": video_id,
            "category": category(r["question_type"]), "question": " ".join(str(r["question"]).split()),
            "options": options, "answer": answer if numeric else answer.upper()[:1],
            "answer_type": "number" if numeric else "choice",
        })
    unique_ids(rows, base / FILE)
    return rows


# Its synthetic twin, by name: its code keys only the stages whose config says ``synthetic``.
BY_NAME = {"synthetic": "embodied_r.synthetic.vsi:write_vsi_bench"}
BENCHMARK = Benchmark(NAME, "VSI-Bench", FILE, "nyu-visionx/VSI-Bench", "main", allow_patterns=[FILE, *ZIPS],
                      read=read, tasks=PAPER_TASKS, archives={name: "" for name in ZIPS}, synthetic=BY_NAME["synthetic"])
