"""The synthetic benchmark: layout, schemas, question formats, answers and determinism."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import SHARED
from embodied_r.benchmarks import urbanvideo, vsibench
from embodied_r.benchmarks.base import arrow_schema
from embodied_r.synthetic.config import SyntheticConfig
from embodied_r.synthetic.generate import make_synthetic_benchmark
from embodied_r.synthetic.vsi import VSI_THINGS
from embodied_r.synthetic.filming import Crew, Shot
from embodied_r.synthetic.world import BGR, Pose, Thing, backdrop, in_view, pose_at, segments_from

REAL_MCQ = (SHARED or Path("/nonexistent")) / "benchmarks" / "urbanvideo-bench" / "MCQ.parquet"
SMALL = dict(urban_videos=5, clips_per_scene=2, vsi_scenes=3, seconds=6.0, width=320, height=180, fps=15.0)
VIDEO_ID = re.compile(r"^(EmbodiedCity_\d+|AerialVLN_\d+_[A-Z0-9]{30}|RealWorld_\d+)(_\d+)?\.mp4$")
MCQ_TEXT = re.compile(r"^Question: (?P<q>.+?)(  \nchoose:  \n|\n\nChoices:  \n)(?P<opts>A\. .+)  $", re.S)
CHOICE_TYPES = {"object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard",
                "object_rel_distance", "route_planning", "obj_appearance_order"}
NUMBER_TYPES = {"object_counting", "object_abs_distance", "object_size_estimation", "room_size_estimation"}


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("synthetic")
    return root, make_synthetic_benchmark(root, SyntheticConfig(seed=3, **SMALL))


def _options(question: str) -> list[str]:
    m = MCQ_TEXT.match(question)
    assert m, f"question not in the real shape: {question!r}"
    return [o.strip() for o in m.group("opts").split("  \n")]


def test_urban_layout_schema_and_naming(bench):
    root, counts = bench
    path = root / "UrbanVideo-Bench" / "MCQ.parquet"
    assert pq.read_schema(path).remove_metadata().equals(arrow_schema(urbanvideo.COLUMNS))
    if REAL_MCQ.exists():
        real = pq.read_schema(REAL_MCQ).remove_metadata()
        assert [(f.name, f.type) for f in real] == [(f.name, f.type) for f in arrow_schema(urbanvideo.COLUMNS)]
    rows = pq.read_table(path).to_pylist()
    assert counts["urban_questions"] == len(rows) > 0
    vids = {r["video_id"] for r in rows}
    assert len(vids) == 5 and all(VIDEO_ID.match(v) for v in vids), vids
    scenes = {re.sub(r"(_\d+)?\.mp4$", "", v) for v in vids}
    assert len(scenes) == 3  # several clips per scene, so scene-disjoint splits mean something
    assert len({r["Question_id"] for r in rows}) == len(rows)
    for v in vids:
        cap = cv2.VideoCapture(str(root / "UrbanVideo-Bench" / "videos" / v))
        assert cap.isOpened() and cap.get(cv2.CAP_PROP_FPS) == pytest.approx(15.0)
        assert cap.get(cv2.CAP_PROP_FRAME_COUNT) >= 15 and cap.get(cv2.CAP_PROP_FRAME_WIDTH) == 320
        cap.release()


def test_urban_questions_real_format_and_answers_in_options(bench):
    root, _ = bench
    rows = pq.read_table(root / "UrbanVideo-Bench" / "MCQ.parquet").to_pylist()
    cats = {r["question_category"] for r in rows}
    assert set(urbanvideo.PAPER_TASKS) <= cats and len(cats - set(urbanvideo.PAPER_TASKS)) >= 2
    for r in rows:
        opts = _options(r["question"])
        letters = [o[0] for o in opts]
        assert letters == list("ABCDEFG"[: len(opts)]) and all(o[1:3] == ". " for o in opts)
        assert r["answer"] in letters
        assert len(set(opts)) == len(opts) and len({o[3:] for o in opts}) == len(opts)


def test_vsi_layout_schema_and_answers(bench):
    root, counts = bench
    vsi = root / "VSI-Bench"
    path = vsi / "test-00000-of-00001.parquet"
    assert pq.read_schema(path).remove_metadata().equals(arrow_schema(vsibench.COLUMNS))
    rows = pq.read_table(path).to_pylist()
    assert counts["vsi_questions"] == len(rows)
    names = {d: set(zipfile.ZipFile(vsi / f"{d}.zip").namelist()) for d in ("arkitscenes", "scannet", "scannetpp")}
    assert all(len(n) == 1 for n in names.values())
    types = {r["question_type"] for r in rows}
    assert CHOICE_TYPES <= types and {"object_counting", "object_abs_distance", "room_size_estimation"} <= types
    for r in rows:
        assert f"{r['dataset']}/{r['scene_name']}.mp4" in names[r["dataset"]]
        if r["question_type"] in NUMBER_TYPES:
            assert r["options"] is None and float(r["ground_truth"]) > 0
        else:
            opts = r["options"]
            assert [o[:3] for o in opts] == [f"{c}. " for c in "ABCD"[: len(opts)]]
            assert r["ground_truth"] in "ABCD"[: len(opts)] and len(r["ground_truth"]) == 1
    counting = [r for r in rows if r["question_type"] == "object_counting"]
    assert any(int(r["ground_truth"]) >= 2 for r in counting)


def test_same_seed_same_benchmark_other_seed_differs(tmp_path):
    cfg = SyntheticConfig(seed=11, urban_videos=2, clips_per_scene=2, vsi_scenes=1, seconds=4.0,
                          width=160, height=90, fps=10.0)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    # Filmed by two worker processes, then all in this process: the same files.
    make_synthetic_benchmark(a, cfg, workers=2)
    make_synthetic_benchmark(b, cfg, workers=1)
    make_synthetic_benchmark(c, cfg.model_copy(update={"seed": 12}))
    for rel in ("UrbanVideo-Bench/MCQ.parquet", "VSI-Bench/test-00000-of-00001.parquet"):
        assert pq.read_table(a / rel).equals(pq.read_table(b / rel))
        assert not pq.read_table(a / rel).equals(pq.read_table(c / rel))
    # Byte for byte, zips included (their entries carry a fixed date), so manifests and
    # fingerprints of a synthetic source do not change from one generation to the next.
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert {f.suffix for f in files} == {".mp4", ".parquet", ".zip"}
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    vid = pq.read_table(a / "UrbanVideo-Bench/MCQ.parquet").column("video_id")[0].as_py()
    frames = []
    for root in (a, b):
        cap = cv2.VideoCapture(str(root / "UrbanVideo-Bench" / "videos" / vid))
        frames.append([cap.read()[1] for _ in range(5)])
    assert all((x == y).all() for x, y in zip(*frames))


def _shot(path: Path, seed: int = 0) -> Shot:
    drawn = backdrop(np.random.default_rng(seed), 64, indoor=False)
    segs = tuple(segments_from([("turn right", 1.0, 30.0)]))
    return Shot(drawn, (), segs, Pose(0.0, 0.0, 1.0), ((path, 3),), 3.0, 64, 36)


def test_a_crew_hands_shots_back_in_order_and_raises_a_workers_error(tmp_path):
    done: list[int] = []
    with Crew(2) as crew:
        for i in range(5):
            crew.submit(_shot(tmp_path / f"{i}.mp4", i), then=lambda i=i: done.append(i))
    assert done == [0, 1, 2, 3, 4] and all((tmp_path / f"{i}.mp4").is_file() for i in range(5))
    (tmp_path / "taken").write_text("a file where the video's folder should be")
    with pytest.raises(Exception, match="taken"):
        with Crew(2) as crew:
            crew.submit(_shot(tmp_path / "taken" / "x.mp4"), then=lambda: done.append(-1))
    assert -1 not in done


def test_camera_path_and_visibility_geometry():
    segs = segments_from([("turn right", 3.0, 30.0), ("rise", 2.0, 5.0), ("fly forward", 1.0, 2.0)])
    assert pose_at(segs, 3.0).yaw == pytest.approx(90.0)
    end = pose_at(segs, 6.0)
    assert (end.yaw, end.pitch, end.zoom) == pytest.approx((90.0, 10.0, 2.0))
    left = pose_at(segments_from([("turn left", 1.0, 45.0)]), 1.0)
    assert left.yaw == pytest.approx(315.0)
    cube = Thing("red cube", "red", "cube", azimuth=100.0, elevation=0.0, size=8.0)
    assert in_view(cube, Pose(90.0, 0.0, 1.0)) and not in_view(cube, Pose(0.0, 0.0, 1.0))
    # Zooming in narrows the view: 25 degrees off-centre leaves a 2x view (30 degrees wide).
    assert in_view(cube, Pose(75.0, 0.0, 1.0)) and not in_view(cube, Pose(75.0, 0.0, 2.0))


# ----------------------------------------------------------------- answers against the pixels
# Saturated object colours never occur in the muted background, so a colour's pixels show
# where its object is. White and black are skipped: labels and outlines use them.
CHECKABLE = {c for c in BGR if c not in ("white", "black")}


def _frames(path: Path) -> list[np.ndarray]:
    cap, out = cv2.VideoCapture(str(path)), []
    while True:
        ok, frame = cap.read()
        if not ok:
            return out
        out.append(frame)


def _pixels(frame: np.ndarray, colour: str) -> int:
    c = np.int16(BGR[colour])
    lo, hi = np.clip(c - 20, 0, 255).astype(np.uint8), np.clip(c + 20, 0, 255).astype(np.uint8)
    return int(cv2.countNonZero(cv2.inRange(frame, lo, hi)))


def _answer_text(row: dict) -> str:
    return next(o[3:] for o in _options(row["question"]) if o[0] == row["answer"])


def test_urban_answers_agree_with_the_rendered_frames(bench):
    root, _ = bench
    rows = pq.read_table(root / "UrbanVideo-Bench" / "MCQ.parquet").to_pylist()
    checked = 0
    for vid in sorted({r["video_id"] for r in rows}):
        frames = _frames(root / "UrbanVideo-Bench" / "videos" / vid)
        for r in (r for r in rows if r["video_id"] == vid):
            if r["question_category"] == "Landmark Position":
                colour = re.search(r"navigate to the (\w+) ", r["question"]).group(1)
                answer = _answer_text(r)
                if colour in CHECKABLE and ("ahead" in answer or "behind" in answer):
                    assert (_pixels(frames[-1], colour) >= 25) == ("ahead" in answer), (vid, answer)
                    checked += 1
            if r["question_category"] == "Object Recall":
                for option in _options(r["question"]):
                    colour = option.split()[2]
                    if colour in CHECKABLE:
                        shown = max(_pixels(f, colour) for f in frames) >= 25
                        assert shown == (option[0] == r["answer"]), (vid, option)
                        checked += 1
    assert checked >= 10


def test_vsi_appearance_order_agrees_with_the_rendered_frames(bench):
    root, _ = bench
    vsi = root / "VSI-Bench"
    rows = pq.read_table(vsi / "test-00000-of-00001.parquet").to_pylist()
    colour_of = {name: colour for name, colour, _, _ in VSI_THINGS}
    checked = 0
    for r in (r for r in rows if r["question_type"] == "obj_appearance_order"):
        order = next(o[3:] for o in r["options"] if o[0] == r["ground_truth"]).split(", ")
        with zipfile.ZipFile(vsi / f"{r['dataset']}.zip") as z:
            z.extract(f"{r['dataset']}/{r['scene_name']}.mp4", root / "unzipped")
        frames = _frames(root / "unzipped" / r["dataset"] / f"{r['scene_name']}.mp4")
        firsts = [next(i for i, f in enumerate(frames) if _pixels(f, colour_of[n]) >= 25)
                  for n in order if colour_of[n] in CHECKABLE]
        assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts), (order, firsts)
        checked += len(firsts) >= 2
    assert checked >= 1


def test_sorted_options_ask_the_same_questions_with_the_same_answers(tmp_path):
    """``option_order: sorted`` lists each question's options alphabetically: the same
    questions, each answer letter moved to where its option now stands."""
    small = dict(urban_videos=2, vsi_scenes=1, width=160, height=90, seconds=6)
    make_synthetic_benchmark(tmp_path / "shuffled", SyntheticConfig(**small))
    make_synthetic_benchmark(tmp_path / "sorted", SyntheticConfig(**small, option_order="sorted"))

    def answers(root: Path) -> list[tuple[str, list[str], str]]:
        rows = pq.read_table(root / "UrbanVideo-Bench" / "MCQ.parquet").to_pylist()
        out = []
        for r in rows:
            stem, _, block = r["question"].partition("\n")
            options = re.findall(r"^([A-H])\. (.*?)\s*$", r["question"], re.MULTILINE)
            text = dict(options)[r["answer"]]
            out.append((stem, [t for _, t in options], text))
        return out

    shuffled, ordered = answers(tmp_path / "shuffled"), answers(tmp_path / "sorted")
    assert [(q, sorted(o), a) for q, o, a in shuffled] == [(q, o, a) for q, o, a in ordered]
    assert all(o == sorted(o) for _, o, _ in ordered)
    assert any(o != sorted(o) for _, o, _ in shuffled)


@pytest.fixture(scope="module")
def fixed_bench(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fixed")
    make_synthetic_benchmark(root, SyntheticConfig(seed=3, urban_videos=24, clips_per_scene=2, vsi_scenes=4,
                                                   seconds=8.0, width=160, height=90, fps=8.0,
                                                   questions_per_category=2, option_order="fixed", balanced=True))
    return root


def _answers(root: Path) -> list[tuple[str, str, list[str], str]]:
    """(task, question stem, option texts, answer letter) of every multiple-choice question."""
    out = []
    for r in pq.read_table(root / "UrbanVideo-Bench" / "MCQ.parquet").to_pylist():
        opts = [o[3:] for o in _options(r["question"])]
        out.append((r["question_category"], r["question"].split("\n")[0], opts, r["answer"]))
    for r in pq.read_table(root / "VSI-Bench" / "test-00000-of-00001.parquet").to_pylist():
        if r["options"] is not None:
            out.append((r["question_type"], r["question"], [o[3:] for o in r["options"]], r["ground_truth"]))
    return out


def test_fixed_options_list_each_closed_set_in_one_order(fixed_bench):
    """Under ``option_order: fixed`` a task whose answers are a closed set lists the whole set
    in one order (the landmark's name aside), so an answer always has the same letter."""
    lists: dict[str, set[tuple[str, ...]]] = {}
    for task, _, opts, _ in _answers(fixed_bench):
        generic = tuple(re.sub(r"^The [a-z]+ [a-z]+ is ", "The X is ", o) for o in opts)
        if task == "Progress Evaluation":  # one step per movement, in one order of movements
            generic = tuple(re.match(r"I (rise|descend|fly forward|fly backward|turn left|turn right)", o).group(1)
                            for o in opts)
        if task == "Counterfactual":
            generic = tuple(re.sub(r"the [a-z]+ [a-z]+", "X", re.sub(r"turn (left|right)", "turn", o)) for o in opts)
        lists.setdefault(task, set()).add(generic)
    for task in ("Action Generation", "Landmark Position", "Progress Evaluation", "Counterfactual",
                 "object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard"):
        assert task in lists and len(lists[task]) == 1, (task, lists.get(task))


def test_balanced_answers_leave_no_letter_a_free_win(fixed_bench):
    """Balanced, the right answers of the closed-set tasks spread over what each can answer:
    landmarks stand left, ahead and right, the way back round is shorter as often as longer."""
    from collections import Counter

    answers = _answers(fixed_bench)
    for task, possible in (("Landmark Position", 3), ("Action Generation", 3), ("Counterfactual", 2)):
        letters = Counter(a for t, _, _, a in answers if t == task)
        assert len(letters) == possible, (task, letters)
        assert max(letters.values()) <= 0.6 * sum(letters.values()), (task, letters)


def test_unbalanced_landmarks_mostly_stand_ahead(bench):
    """The control for the test above: without balancing, where a landmark is at the end of a
    clip is mostly "ahead", which a reasoner could answer without reading the video."""
    rows = pq.read_table(bench[0] / "UrbanVideo-Bench" / "MCQ.parquet").to_pylist()
    lp = [r for r in rows if r["question_category"] == "Landmark Position"]
    ahead = [r for r in lp if dict((o[0], o[3:]) for o in _options(r["question"]))[r["answer"]].endswith("ahead of me.")]
    assert len(ahead) > 0.6 * len(lp)


def test_every_question_says_what_decides_it(fixed_bench):
    """``question_facts.parquet``: one row per question, a known kind, about things the
    question names (its landmark, the objects whose first sightings or places decide it)."""
    from embodied_r.synthetic.truth import FACT_KINDS, FACTS_FILE

    for sub, ids, text in (("UrbanVideo-Bench", "Question_id", "question"),
                           ("VSI-Bench", "id", "question")):
        name = "MCQ.parquet" if sub.startswith("Urban") else "test-00000-of-00001.parquet"
        rows = {str(r[ids]): r for r in pq.read_table(fixed_bench / sub / name).to_pylist()}
        facts = pq.read_table(fixed_bench / sub / FACTS_FILE).to_pylist()
        assert sorted(f["question_id"] for f in facts) == sorted(rows)
        for f in facts:
            assert f["kind"] in FACT_KINDS
            question = rows[f["question_id"]][text] + " ".join(rows[f["question_id"]].get("options") or [])
            assert all(o in question for o in f["objects"]), (f, question)
