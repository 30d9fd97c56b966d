"""The benchmarks' source formats and roles: option parsing, scene rules, the paper's task
subset, and which benchmarks are evaluation-only (never trained on) with the splits that say so."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, get_args

URBANVIDEO = "urbanvideo"
VSIBENCH = "vsibench"
EGOSCHEMA = "egoschema"
MVBENCH = "mvbench"
Benchmark = Literal["urbanvideo", "vsibench", "egoschema", "mvbench"]
BENCHMARKS: tuple[str, ...] = get_args(Benchmark)

# The paper trains and tests on these (scene-disjoint splits) ...
TRAINING_BENCHMARKS = (URBANVIDEO, VSIBENCH)
# ... and measures out-of-distribution transfer on these, which no split ever trains on: every
# one of their questions is in the ``ood`` split.
EVALUATION_BENCHMARKS = (EGOSCHEMA, MVBENCH)

# The scene-disjoint splits of the training benchmarks, and the split of the evaluation-only ones.
SPLITS = ("train", "val", "test")
OOD = "ood"
Split = Literal["train", "val", "test", "ood"]
ALL_SPLITS: tuple[str, ...] = get_args(Split)

URBANVIDEO_DIR = "UrbanVideo-Bench"
VSIBENCH_DIR = "VSI-Bench"
EGOSCHEMA_DIR = "EgoSchema"
MVBENCH_DIR = "MVBench"
URBANVIDEO_FILE = "MCQ.parquet"
VSIBENCH_FILE = "test-00000-of-00001.parquet"
VSIBENCH_ZIPS = ("arkitscenes.zip", "scannet.zip", "scannetpp.zip")
# EgoSchema's 500 questions whose answers are public (lmms-lab/egoschema's ``Subset`` config).
# The other 4,531 of its 5,031 are scored only by the benchmark's own server, so they are
# neither fetched nor evaluated here.
EGOSCHEMA_FILE = "Subset/test-00000-of-00001.parquet"
EGOSCHEMA_TASK = "egoschema_subset"  # its category: the subset has no task types
# All 5,031 clips come in five archives (about 21 GB each); the subset's 500 lie across all of
# them, so every archive is fetched and only the subset's clips are extracted.
EGOSCHEMA_ZIPS = "videos_chunked_*.zip"
# MVBench's tasks whose videos are egocentric, each with the archive of its videos. Of its 20
# tasks (11 video sources) only egocentric_navigation shows what an agent moving through a
# space sees from its own camera (VLN-CE routes in Matterport3D homes), the viewpoint of
# UrbanVideo-Bench's flights and VSI-Bench's walk-throughs; the others are third-person
# recordings (Charades via STAR, Perception Test, TVQA, NTU RGB+D, Something-Something, FunQA,
# Moments in Time, scene_qa) or synthetic renders (CLEVRER). Widen transfer by adding a task
# and its archive here: download, catalog and evaluation follow.
MVBENCH_EGOCENTRIC = {"egocentric_navigation": "video/vlnqa.zip"}
MVBENCH_JSON = "json/{task}.json"

# The files each benchmark needs from its hub repo (or a mirror laid out like it), as
# ``fnmatch`` patterns the way ``huggingface_hub`` applies them: nothing else is fetched.
# MVBench's task files are small and all fetched (a task named in ``catalog.tasks`` is then
# known), its video archives only for the egocentric tasks.
ALLOW_PATTERNS = {
    URBANVIDEO: [URBANVIDEO_FILE, "videos/*"],
    VSIBENCH: [VSIBENCH_FILE, *VSIBENCH_ZIPS],
    EGOSCHEMA: [EGOSCHEMA_FILE, EGOSCHEMA_ZIPS],
    MVBENCH: [MVBENCH_JSON.format(task="*"), *sorted(set(MVBENCH_EGOCENTRIC.values()))],
}
BENCHMARK_DIRS = {URBANVIDEO: URBANVIDEO_DIR, VSIBENCH: VSIBENCH_DIR, EGOSCHEMA: EGOSCHEMA_DIR, MVBENCH: MVBENCH_DIR}
# The file whose presence says a source holds the benchmark.
QUESTION_FILES = {URBANVIDEO: URBANVIDEO_FILE, VSIBENCH: VSIBENCH_FILE, EGOSCHEMA: EGOSCHEMA_FILE,
                  MVBENCH: MVBENCH_JSON.format(task=next(iter(MVBENCH_EGOCENTRIC)))}
# Video archives (glob patterns inside the benchmark's folder) and the folder under its
# ``videos/`` each is extracted into.
VIDEO_ARCHIVES = {
    VSIBENCH: {name: "" for name in VSIBENCH_ZIPS},
    EGOSCHEMA: {EGOSCHEMA_ZIPS: ""},
    MVBENCH: {archive: Path(archive).stem for archive in sorted(set(MVBENCH_EGOCENTRIC.values()))},
}

# The paper's task subset (DESIGN.md).
PAPER_TASKS = {
    URBANVIDEO: ["Landmark Position", "Counterfactual", "Progress Evaluation", "Action Generation"],
    VSIBENCH: ["object_rel_direction", "object_rel_distance", "route_planning", "obj_appearance_order"],
}
# What ``catalog.tasks: paper`` keeps of the evaluation-only benchmarks: out-of-distribution
# transfer on egocentric video (DESIGN.md).
TRANSFER_TASKS = {EGOSCHEMA: [EGOSCHEMA_TASK], MVBENCH: list(MVBENCH_EGOCENTRIC)}

# VSI-Bench question types that score by mean relative accuracy.
VSIBENCH_NUMERIC = {
    "object_counting",
    "object_abs_distance",
    "object_size_estimation",
    "room_size_estimation",
}


def evaluation_only(benchmark: str) -> bool:
    return benchmark in EVALUATION_BENCHMARKS


def splits_of(benchmark: str) -> tuple[str, ...]:
    """The splits a benchmark's questions can be in."""
    return (OOD,) if evaluation_only(benchmark) else SPLITS


class DataSourceError(ValueError):
    """A dataset source that is missing, unreachable or malformed; the message names the fix."""


_REL_DIRECTION = re.compile(r"^object_rel_direction(_(easy|medium|hard))?$")
_OPTION_HEADER = re.compile(r"(?:Choices?|Options?|choose)\s*:", re.IGNORECASE)
_FIRST_OPTION = re.compile(r"(?:^|\s)A[.)]\s?")
_QUOTES = "\"'`“”‘’ "


def vsibench_category(question_type: str) -> str:
    """The three relative-direction subtypes are one task, as the paper reports them."""
    return "object_rel_direction" if _REL_DIRECTION.match(question_type) else question_type


def _option_marker(letter: str, inline: bool) -> re.Pattern[str]:
    # At a line start the space after the dot may be missing ("C.The ..."); inside a
    # line (options written on one line) a space before and after is required.
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


def split_urbanvideo_question(text: str) -> tuple[str, list[str]]:
    """Split an UrbanVideo-Bench question into its stem and ``["A. ...", "B. ..."]``.

    The published text has several layouts (``Choices:`` / ``Options:`` / ``choose:`` headers,
    options on one line or many, code fences around the whole); options are read as the
    sequence A, B, C, ... of markers after the header.
    """
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


def normalise_vsibench_options(options: list[str] | None) -> list[str]:
    """VSI-Bench options already carry their letters ("A. left"); make sure they do."""
    if not options:
        return []
    out = []
    for i, opt in enumerate(options):
        opt = " ".join(str(opt).split())
        letter = chr(65 + i)
        if not re.match(rf"^{letter}[.)]\s*", opt):
            opt = f"{letter}. {opt}"
        out.append(opt)
    return out


def lettered_options(options: list[str] | None) -> list[str]:
    """Options as ``["A. ...", "B. ...", ...]`` in their given order; a marker an option
    already carries for its own position ("A. ", "A) ", "(A) ") is not repeated."""
    out = []
    for i, opt in enumerate(options or []):
        letter = chr(65 + i)
        text = re.sub(rf"^\(?{letter}[.):]\s*", "", " ".join(str(opt).split()))
        out.append(f"{letter}. {text}")
    return out


def egoschema_answer_letter(answer: object, n_options: int) -> str | None:
    """The letter of EgoSchema's answer, which is the right option's 0-based index ("0" is
    A); None when it is not an index of one of the ``n_options`` options."""
    text = "" if answer is None else str(answer).strip()
    if text.isdigit() and int(text) < n_options:
        return chr(65 + int(text))
    return None


def mvbench_answer_letter(answer: object, candidates: list[str]) -> str | None:
    """The letter of MVBench's answer, which is the text of the right candidate; None when
    it matches no candidate or more than one."""
    def norm(text: object) -> str:
        return " ".join(str(text).split())

    hits = [i for i, c in enumerate(candidates) if norm(c) == norm(answer)]
    return chr(65 + hits[0]) if len(hits) == 1 else None


def urbanvideo_scene(video_id: str) -> str:
    """Scene of an UrbanVideo-Bench clip, by the benchmark's own naming rules.

    ``EmbodiedCity_X[_k]`` -> ``EmbodiedCity_X``; ``AerialVLN_a_b[_k]`` -> ``AerialVLN_a_b``;
    ``RealWorld_n...`` -> ``RealWorld_n``; anything else is its own scene.
    """
    stem = Path(video_id).stem
    parts = stem.split("_")
    if parts[0] == "EmbodiedCity" and len(parts) >= 2:
        return "_".join(parts[:2])
    if parts[0] == "AerialVLN" and len(parts) >= 3:
        return "_".join(parts[:3])
    if parts[0] == "RealWorld" and len(parts) >= 2:
        return "_".join(parts[:2])
    return stem


def question_block(template: str, question: str, options: list[str] | tuple[str, ...] | None) -> str:
    """A question and its option lines in a prompt's own layout: ``template`` holds
    ``{question}`` and ``{options}`` (the lines joined by newlines). The result is stripped,
    as the original code stripped the text it cut the question from."""
    lines = [str(o).strip() for o in options or [] if o and str(o).strip()]
    return template.format(question=(question or "").strip(), options="\n".join(lines)).strip()
