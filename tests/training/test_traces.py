"""Reasoning traces that read: the deciding words quoted from the record's own perception
text, then the option they point to (``training.traces``), and the warm start's use of them."""

from __future__ import annotations

import json

import pytest

from embodied_r.training.traces import clause, fact_think, option_text, quote
from embodied_r.training.warmstart import traces
from embodied_r.training.config import WarmstartConfig

PROMPT = """Video content:
<
Frame 0: Observe: the red cube is on my left; the blue cylinder is on my right
Frame 1: After rotate left, Observe: I turned about 45 degrees. the green sphere is ahead of me none
Frame 2: After move up, Observe: nothing new the red cube is ahead of me (2.5 m away, 3 degrees left)
Frame 3: After rotate right, Observe: I turned about 30 degrees. nothing new the green sphere is on my right
>
Question: ..."""


def record(fact: dict | None, options: list[str], solution: str, **extra) -> dict:
    return {"uid": "u:1", "split": "train", "prompt": PROMPT, "question": "Q", "solution": solution,
            "answer_type": "choice", "options": options, "fact": json.dumps(fact) if fact else "", **extra}


def test_a_clause_runs_from_the_mention_to_its_end_keeping_decimals():
    assert clause("nothing new the red cube is ahead of me (2.5 m away, 3 degrees left)", "red cube") \
        == "the red cube is ahead of me (2.5 m away, 3 degrees left)"
    assert clause("the red cube is on my left; the blue cylinder is on my right", "red cube") \
        == "the red cube is on my left"
    assert clause("nothing new", "red cube") is None


@pytest.mark.parametrize("fact, expected", [
    # The last frame that shows the object, not the first.
    ({"kind": "place_now", "objects": ["green sphere"]}, "Frame 3: the green sphere is on my right"),
    ({"kind": "place_now", "objects": ["yellow cone"]}, "No frame shows the yellow cone"),
    ({"kind": "last_action", "objects": []}, "Frame 3: after rotate right"),
    ({"kind": "turn_to", "objects": ["green sphere"]}, "Frame 1: after rotate left, the green sphere is ahead of me none"),
    ({"kind": "first_seen", "objects": ["green sphere", "red cube", "lamp"]},
     "First seen: the red cube in frame 0, the green sphere in frame 1, the lamp in no frame"),
    ({"kind": "positions", "objects": ["red cube", "blue cylinder", "green sphere"]},
     "Frame 0: the red cube is on my left; Frame 0: the blue cylinder is on my right"),
    ({"kind": "actions", "objects": []}, "I rotate left, then move up, then rotate right"),
])
def test_each_kind_of_fact_quotes_what_the_frames_say(fact, expected):
    assert quote(fact, PROMPT) == expected


def test_the_option_named_is_what_sets_it_apart_from_the_others():
    options = ["A. The green sphere is ahead of me.", "B. The green sphere is on my left.",
               "C. The green sphere is on my right.", "D. The green sphere is behind me."]
    assert option_text(record(None, options, "C")) == "on my right"
    assert option_text(record(None, ["A. left", "B. right"], "B")) == "right"
    # One option alone keeps its words.
    assert option_text(record(None, ["A. I turn left."], "A")) == "I turn left"


def test_a_reading_trace_quotes_then_maps_and_ends_on_the_gold_letter():
    options = ["A. I rise.", "B. I turn left.", "C. I turn right."]
    think = fact_think(record({"kind": "place_now", "objects": ["green sphere"]}, options, "C"))
    assert think == "Frame 3: the green sphere is on my right. The option that says turn right is C."
    # Where perception erred, the trace still quotes perception; the map still names the gold option.
    think = fact_think(record({"kind": "place_now", "objects": ["green sphere"]}, options, "B"))
    assert think.startswith("Frame 3: the green sphere is on my right.") and think.endswith("turn left is B.")
    # No fact (a real benchmark): the option alone.
    assert fact_think(record(None, options, "B")) == "The option that says turn left is B."
    number = record(None, [], "3.5", answer_type="number")
    assert fact_think(number) == "So the answer is 3.5."


def test_the_warm_start_writes_reading_traces_when_asked():
    options = ["A. I rise.", "B. I turn left.", "C. I turn right."]
    rows = [record({"kind": "last_action", "objects": []}, options, "C")]
    fact = traces(rows, WarmstartConfig(trace="fact", reference_examples=False))
    assert fact[0]["target"] == ("<think>Frame 3: after rotate right. The option that says turn right is C.</think>"
                                 "<answer>C</answer>")
    answer = traces(rows, WarmstartConfig(trace="answer", reference_examples=False))
    assert "Frame 3" not in answer[0]["target"] and answer[0]["target"].endswith("<answer>C</answer>")
