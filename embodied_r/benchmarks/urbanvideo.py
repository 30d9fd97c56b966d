"""UrbanVideo-Bench: aerial clips' multiple choice, the options inside the question text; its
option parsing, its scene rule, the paper's tasks of it and its synthetic twin."""

from __future__ import annotations

import re
from pathlib import Path

from embodied_r.benchmarks.base import Benchmark, Keep, failure, missing_field, outside, read_checked, unique_ids

NAME = "urbanvideo"
FILE = "MCQ.parquet"
COLUMNS = (("Question_id", "int64"), ("video_id", "string"), ("question_category", "string"),
           ("question", "string"), ("answer", "string"))
# The paper's task subset (DESIGN.md).
PAPER_TASKS = ("Landmark Position", "Counterfactual", "Progress Evaluation", "Action Generation")

_OPTION_HEADER = re.compile(r"(?:Choices?|Options?|choose)\s*:", re.IGNORECASE)
_FIRST_OPTION = re.compile(r"(?:^|\s)A[.)]\s?")
_QUOTES = "\"'`“”‘’ "


def _option_marker(letter: str, inline: bool) -> re.Pattern[str]:
    # At a line start the space after the dot may be missing ("C.The ..."); inside a line
    # a space before and after is required.
    line_start = rf"(?:^|\n)[ \t]*(?:Answer:\s*)?{letter}[.)]\s*"
    return re.compile(rf"(?:{line_start}|(?<=\s){letter}[.)]\s)" if inline else line_start)


def _markers(body: str, inline: bool) -> list[re.Match[str]]:
    marks: list[re.Match[str]] = []
    pos = 0
    for i in range(26):
        found = _option_marker(chr(65 + i), inline).search(body, pos)
        if not found:
            break
        marks.append(found)
        pos = found.end()
    return marks


def _clean(text: str) -> str:
    for fence in ('"""', "```", "“““", "”””"):
        text = text.replace(fence, " ")
    return " ".join(text.split()).strip(_QUOTES)


def split_question(text: str) -> tuple[str, list[str]]:
    """The stem and ``["A. ...", "B. ..."]``, whatever the published layout (``Choices:`` /
    ``Options:`` / ``choose:``, options on one line or many, code fences)."""
    header = _OPTION_HEADER.search(text)
    if header:
        stem, body = text[: header.start()], text[header.end() :]
    else:
        first = _FIRST_OPTION.search(text)
        if not first:
            return _clean(re.sub(r"^\W*Question\s*:", "", text)), []
        stem, body = text[: first.start()], text[first.start() :]
    # Options one per line are read from line starts only, so "building B. then" inside
    # an option stays text; options run together on one line need the inline markers.
    marks = _markers(body, inline=False)
    if len(marks) < 2:
        marks = _markers(body, inline=True)
    options = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(body)
        options.append(f"{chr(65 + i)}. {_clean(body[mark.end():end])}")
    stem = _clean(re.sub(r"^\W*Question\s*:", "", _clean(stem)))
    stem = re.sub(r"\s*Answer\s*:?$", "", stem)
    return stem, options


def scene(video_id: str) -> str:
    """``EmbodiedCity_X[_k]`` -> ``EmbodiedCity_X``; ``AerialVLN_a_b[_k]`` -> ``AerialVLN_a_b``;
    ``RealWorld_n...`` -> ``RealWorld_n``; anything else is its own scene."""
    stem = Path(video_id).stem
    parts = stem.split("_")
    if parts[0] == "EmbodiedCity" and len(parts) >= 2:
        return "_".join(parts[:2])
    if parts[0] == "AerialVLN" and len(parts) >= 3:
        return "_".join(parts[:3])
    if parts[0] == "RealWorld" and len(parts) >= 2:
        return "_".join(parts[:2])
    return stem


def read(base: Path, failures: list[dict], keep: Keep | None = None) -> list[dict]:
    rows = []
    for r in read_checked(base / FILE, COLUMNS):
        uid = f"{NAME}:{r['Question_id']}"
        if why := missing_field(r, ("Question_id", "video_id", "question", "answer")):
            failures.append(failure(uid, why))
            continue
        if refused := outside(base, uid, r["video_id"], r["video_id"]):
            failures.append(refused)
            continue
        stem, options = split_question(r["question"] or "")
        answer = (r["answer"] or "").strip().upper()
        if answer not in [o[0] for o in options]:
            failures.append(failure(uid, f"answer_not_an_option: answer {r['answer']!r} is not one of the parsed "
                                         f"options {[o[0] for o in options]}"))
            continue
        rows.append({
            "uid": uid, "benchmark": NAME, "original_id": str(r["Question_id"]),
            "video_id": r["video_id"], "video_path": str((base / "videos" / r["video_id"]).resolve()),
            "scene": scene(r["video_id"]), "category": r["question_category"],
            "question": stem, "options": options, "answer": answer, "answer_type": "choice",
        })
    unique_ids(rows, base / FILE)
    return rows


# Its synthetic twin, by name: its code keys only the stages whose config says ``synthetic``.
BY_NAME = {"synthetic": "embodied_r.synthetic.urban:write_urban_bench"}
BENCHMARK = Benchmark(NAME, "UrbanVideo-Bench", FILE, "EmbodiedCity/UrbanVideo-Bench", "main",
                      allow_patterns=[FILE, "videos/*"], read=read, tasks=PAPER_TASKS, synthetic=BY_NAME["synthetic"])
