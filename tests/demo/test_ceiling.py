"""The scripted reader that answers from the perception text alone (the demo's ceiling)."""

from __future__ import annotations

import pytest

from embodied_r.demo.ceiling import answer, floor_plan, frames

FLIGHT = "\n".join([
    "Frame 0: Observe: the red cube is ahead of me",
    "Frame 1: After rotate left, Observe: I turned about 100 degrees. the blue sphere is on my left none",
    "Frame 2: After rotate left, Observe: I turned about 100 degrees. the green cone is ahead of me none",
    "Frame 3: After move up, Observe: nothing new the blue sphere is on my right",
])
ROOM = "\n".join([
    "Frame 0: Observe: the chair is ahead of me (2.0 m away, 0 degrees left)",
    "Frame 1: After rotate right, Observe: I turned about 90 degrees. the sofa is ahead of me (1.0 m away, 0 degrees right)",
    "Frame 2: After rotate right, Observe: I turned about 90 degrees. the tv is ahead of me (3.0 m away, 0 degrees right)",
    "Frame 3: After rotate right, Observe: I turned about 90 degrees. the bed is on my left (1.0 m away, 20 degrees left)",
])


def test_frames_read_turns_and_mentions():
    fs = frames(ROOM)
    assert [f["turn"] for f in fs] == [0.0, 90.0, 90.0, 90.0]
    assert fs[3]["seen"] == [("bed", "on my left", 1.0, -20.0)]
    plan = floor_plan(fs)
    assert abs(plan["sofa"][0] - 1.0) < 1e-9 and abs(plan["sofa"][1]) < 1e-9
    assert abs(plan["tv"][1] + 3.0) < 1e-9


def test_where_things_are_now_and_the_next_move():
    q = "At the initial position, you are asked to navigate to the blue sphere. When you reach the current location, what is the direction to the destination?"
    opts = ["A. The blue sphere is on my left.", "B. The blue sphere is on my right.", "C. The blue sphere is behind me."]
    assert answer("Landmark Position", q, opts, FLIGHT) == "B"
    moves = ["A. I turn left.", "B. I fly forward.", "C. I turn right."]
    assert answer("Action Generation", q.replace("When", "What is your next move? When"), moves, FLIGHT) == "C"
    steps = ["A. I turn left toward the red cube.", "B. I rise.", "C. I descend."]
    assert answer("Progress Evaluation", "What are you doing now?", steps, FLIGHT) == "B"


def test_counterfactual_adds_up_the_turn():
    q = "Instead of turning left toward the green cone, if you choose to turn right, can you still face the green cone, and how is the alternative route?"
    opts = ["A. If I turn right instead, I can still face the green cone, but the alternative turn takes longer.",
            "B. If I turn right instead, I can still face the green cone, and the alternative turn is shorter."]
    assert answer("Counterfactual", q, opts, FLIGHT) == "B"  # 200 degrees left: right is shorter


def test_order_distance_direction_and_route_from_the_plan():
    order = ["A. tv, sofa, chair", "B. chair, sofa, tv", "C. sofa, chair, tv"]
    assert answer("obj_appearance_order", "What will be the first-time appearance order of the following "
                  "categories in the video: tv, sofa, chair?", order, ROOM) == "B"
    q = "Measuring from the closest point of each object, which of these objects (sofa, tv, bed) is the closest to the chair?"
    assert answer("object_rel_distance", q, ["A. tv", "B. sofa", "C. bed"], ROOM) == "B"
    # At the chair (0, 2) facing the tv (0, -3): the sofa (1, 0) is ahead and to the left.
    q = "If I am standing by the chair and facing the tv, is the sofa to the left or the right of the tv?"
    assert answer("object_rel_direction", q, ["A. left", "B. right"], ROOM) == "A"
    route = ("You are a robot beginning at the chair facing the tv. You want to navigate to the bed. You will "
             "perform the following actions: 1. [please fill in]. 2. Go forward until the sofa. 3. [please fill "
             "in]. 4. Go forward until the bed. You have reached the final destination.")
    opts = ["A. Turn Left, Turn Right", "B. Turn Left, Turn Back", "C. Turn Right, Turn Left"]
    assert answer("route_planning", route, opts, ROOM) == "A"


def test_undecided_questions_get_no_answer():
    q = "At the initial position, you are asked to navigate to the white cone. When you reach the current location, what is the direction to the destination?"
    assert answer("Landmark Position", q, ["A. The white cone is ahead of me."], FLIGHT) is None


def test_the_letter_prior_answers_each_task_its_commonest_train_letter(tmp_path):
    from embodied_r import schemas
    from embodied_r.demo.ceiling import letter_prior
    from embodied_r.io import table_from_records, write_parquet_atomic

    def row(i, split, category, answer):
        return {"uid": f"u:{i}", "split": split, "category": category, "answer": answer, "answer_type": "choice",
                "options": ["A. x", "B. y"], "question": "q"}

    rows = [row(0, "train", "t1", "A"), row(1, "train", "t1", "A"), row(2, "train", "t1", "B"),
            row(3, "train", "t2", "B"), row(4, "test", "t1", "A"), row(5, "test", "t1", "B"),
            row(6, "test", "t2", "B"), row(7, "test", "t2", "A")]
    catalog = tmp_path / "catalog.parquet"
    write_parquet_atomic(table_from_records(rows, schemas.CATALOG), catalog)
    assert letter_prior(catalog, "test") == 0.5


def test_the_answers_own_chance_counts_only_the_answers_a_task_has(tmp_path):
    """Seven options of which the train split makes three right: a guess among those three.
    A task with one answer in train is a sure guess; a question with fewer options than its
    task's answers is a guess among its own options."""
    from embodied_r import schemas
    from embodied_r.demo.ceiling import answer_chance
    from embodied_r.io import table_from_records, write_parquet_atomic

    seven = [f"{letter}. o" for letter in "ABCDEFG"]

    def row(i, split, category, answer, options=seven):
        return {"uid": f"u:{i}", "split": split, "category": category, "answer": answer, "answer_type": "choice",
                "options": options, "question": "q"}

    rows = [row(0, "train", "moves", "C"), row(1, "train", "moves", "E"), row(2, "train", "moves", "F"),
            row(3, "train", "one", "A"), row(4, "test", "moves", "C"), row(5, "test", "one", "B"),
            row(6, "train", "pairs", "A"), row(7, "train", "pairs", "B"), row(8, "train", "pairs", "C"),
            row(9, "test", "pairs", "A", ["A. x", "B. y"])]
    catalog = tmp_path / "catalog.parquet"
    write_parquet_atomic(table_from_records(rows, schemas.CATALOG), catalog)
    assert answer_chance(catalog, "test") == pytest.approx((1 / 3 + 1 + 1 / 2) / 3)
