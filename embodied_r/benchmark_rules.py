"""The two benchmarks' source formats: option parsing, scene rules, the paper's task subset."""

from __future__ import annotations

import re
from pathlib import Path

URBANVIDEO = "urbanvideo"
VSIBENCH = "vsibench"

URBANVIDEO_DIR = "UrbanVideo-Bench"
VSIBENCH_DIR = "VSI-Bench"
URBANVIDEO_FILE = "MCQ.parquet"
VSIBENCH_FILE = "test-00000-of-00001.parquet"
VSIBENCH_ZIPS = ("arkitscenes.zip", "scannet.zip", "scannetpp.zip")

# The files each benchmark needs from its hub repo (or a mirror laid out like it), as
# ``fnmatch`` patterns the way ``huggingface_hub`` applies them: nothing else is fetched.
ALLOW_PATTERNS = {
    URBANVIDEO: [URBANVIDEO_FILE, "videos/*"],
    VSIBENCH: [VSIBENCH_FILE, *VSIBENCH_ZIPS],
}
BENCHMARK_DIRS = {URBANVIDEO: URBANVIDEO_DIR, VSIBENCH: VSIBENCH_DIR}
QUESTION_FILES = {URBANVIDEO: URBANVIDEO_FILE, VSIBENCH: VSIBENCH_FILE}

# The paper's task subset (DESIGN.md).
PAPER_TASKS = {
    URBANVIDEO: ["Landmark Position", "Counterfactual", "Progress Evaluation", "Action Generation"],
    VSIBENCH: ["object_rel_direction", "object_rel_distance", "route_planning", "obj_appearance_order"],
}

# VSI-Bench question types that score by mean relative accuracy.
VSIBENCH_NUMERIC = {
    "object_counting",
    "object_abs_distance",
    "object_size_estimation",
    "room_size_estimation",
}


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
