"""Option parsing and scene rules against the real UrbanVideo-Bench question file."""

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embodied_r.benchmarks import urbanvideo, vsibench

REAL_MCQ = Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "urbanvideo-bench" / "MCQ.parquet"
needs_real = pytest.mark.skipif(not REAL_MCQ.is_file(), reason=f"real MCQ.parquet not found at {REAL_MCQ} "
                                "(it sits in ../shared beside a project checkout)")


@needs_real
def test_every_real_row_parses_and_its_answer_is_an_option():
    rows = pq.read_table(REAL_MCQ).to_pylist()
    assert len(rows) == 5355
    bad = []
    for r in rows:
        stem, options = urbanvideo.split_question(r["question"])
        letters = [o[0] for o in options]
        if not stem or len(options) < 2 or r["answer"] not in letters:
            bad.append(r["Question_id"])
        assert letters == [chr(65 + i) for i in range(len(letters))]
        assert all(len(o) > 3 for o in options)
    assert bad == []


@needs_real
def test_paper_task_counts():
    counts = Counter(r["question_category"] for r in pq.read_table(REAL_MCQ).to_pylist())
    paper = {t: counts[t] for t in urbanvideo.PAPER_TASKS}
    assert paper == {"Action Generation": 1183, "Landmark Position": 876,
                     "Progress Evaluation": 781, "Counterfactual": 134}


def test_option_layouts():
    inline = "Question: Where?  \nChoices: A. Left.  \n         B. Right.  \n         C. Ahead.  "
    assert urbanvideo.split_question(inline) == ("Where?", ["A. Left.", "B. Right.", "C. Ahead."])
    fenced = '```\n"""\nQuestion: Which way?\nchoose:\nAnswer: A. Up.\nB. Down.\n\n"""\n```'
    assert urbanvideo.split_question(fenced) == ("Which way?", ["A. Up.", "B. Down."])
    no_space = "Question: Q?\nChoices:\nA. one\nB.two\nC. three"
    assert urbanvideo.split_question(no_space)[1] == ["A. one", "B. two", "C. three"]
    # A letter and dot inside an option's text is not a new option.
    tricky = "Question: Q?\nOptions: A. Go to building B. then stop.\nB. Hover."
    assert urbanvideo.split_question(tricky)[1] == ["A. Go to building B. then stop.", "B. Hover."]


def test_scene_rules():
    assert urbanvideo.scene("EmbodiedCity_23_2.mp4") == "EmbodiedCity_23"
    assert urbanvideo.scene("EmbodiedCity_1.mp4") == "EmbodiedCity_1"
    assert urbanvideo.scene("AerialVLN_98_3QAVNHZ3EV2TWA6OU739IISOPDPALK_0.mp4") == \
        "AerialVLN_98_3QAVNHZ3EV2TWA6OU739IISOPDPALK"
    assert urbanvideo.scene("AerialVLN_113_3U4J9857ON9Z0ZMEWR2VUOUTF1V7BC.mp4") == \
        "AerialVLN_113_3U4J9857ON9Z0ZMEWR2VUOUTF1V7BC"
    assert urbanvideo.scene("RealWorld_47_1.mp4") == "RealWorld_47"
    assert urbanvideo.scene("RealWorld_33.mp4") == "RealWorld_33"


def test_vsibench_direction_subtypes_merge():
    for sub in ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard"):
        assert vsibench.category(sub) == "object_rel_direction"
    assert vsibench.category("route_planning") == "route_planning"
    assert vsibench.normalise_options(["left", "B. right"]) == ["A. left", "B. right"]
