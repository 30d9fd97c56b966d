"""The episode loop on the built-in household environment with scripted replies."""

from __future__ import annotations

import pytest

from embodied_r.interactive import prompts, tasks
from embodied_r.interactive.actions import match_object, parse_decision
from embodied_r.interactive.episode import EpisodeConfig, run_episodes
from embodied_r.interactive.household import HouseholdEnvironment
from embodied_r.interactive.metrics import aggregate

TASK = {"scene": "House1", "tasktype": "pickup_from_closerep_and_put", "identity": 7,
        "taskname": "put the apple from the fridge on the table",
        "taskquery": "Could you take the apple out of the fridge and put it on the table?",
        "target_objects": [], "related_objects": [], "navigable_objects": ["Fridge", "DiningTable"],
        "task_metadata": {"actions": [{"action": a, "objectType": o} for a, o in [
            ("navigate to", "Fridge"), ("open", "Fridge"), ("pickup", "Apple"), ("close", "Fridge"),
            ("navigate to", "DiningTable"), ("put", "DiningTable"), ("end", "")]]}}


def scripted(replies):
    queue = list(replies)

    def generate(conversations):
        return [f"<Thinking>...</Thinking><DecisionMaking>{queue.pop(0) if queue else 'observe'}</DecisionMaking>"
                for _ in conversations]
    return generate


def run(replies, tmp_path, **cfg):
    eps = run_episodes([TASK], HouseholdEnvironment, scripted(replies), tmp_path, EpisodeConfig(**cfg))
    return eps[0]


def test_parse_and_match():
    types = ["Fridge", "DiningTable", "Apple"]
    assert parse_decision("x <DecisionMaking>navigate to fridge</DecisionMaking>", types).obj == "Fridge"
    assert parse_decision("<DecisionMaking>put in DiningTable</DecisionMaking>", types).verb == "put in"
    assert parse_decision("<DecisionMaking>pickup apple</DecisionMaking>", types).obj == "Apple"
    d = parse_decision("<DecisionMaking>pickup Spaceship</DecisionMaking>", types)
    assert d.obj is None and d.unmatched == "Spaceship"
    assert parse_decision("no tag", types).verb == "error"
    assert parse_decision("<DecisionMaking>dance</DecisionMaking>", types).verb == "error"
    assert match_object("dining table", types) == "DiningTable"


def test_solved_episode_scores_and_converses(tmp_path):
    ep = run(["navigate to Fridge", "open Fridge", "pickup Apple", "close Fridge", "navigate to DiningTable",
              "put DiningTable", "end"], tmp_path)
    r = ep.result()
    assert ep.stop == "end" and r["success"] == 1 and r["efficiency"] == 1.0
    assert sum(m["content"].count("<image>") for m in ep.messages) == len(ep.images) == 7
    assert all(p.endswith(".png") for p in ep.images)


def test_illegal_action_gets_a_feedback_turn_and_counts_as_a_step(tmp_path):
    ep = run(["pickup Apple", "navigate to Fridge", "open Fridge", "pickup Apple", "close Fridge",
              "navigate to DiningTable", "put DiningTable", "end"], tmp_path)
    assert ep.messages[3]["content"].startswith(prompts.FEEDBACK)
    r = ep.result()
    assert r["success"] == 1 and r["efficiency"] == pytest.approx(8 / 9)


def test_repeated_action_ends_with_a_failed_end(tmp_path):
    ep = run(["navigate to Fridge"] * 5, tmp_path)
    assert ep.stop == "repeated_action" and ep.steps == 4  # init + navigate x3
    assert ep.trajectory[-1] == {"action": "end", "object": None, "legal_objects": [], "success": 0}


def test_step_limit_appends_a_successful_end_unless_turned_off(tmp_path):
    moves = ["observe", "move forward"] * 20
    ep = run(moves, tmp_path)
    assert ep.stop == "step_limit" and ep.steps == tasks.step_limit(TASK["tasktype"]) == 30
    assert ep.trajectory[-1]["success"] == 1
    off = run(moves, tmp_path / "off", always_append_end=False)
    assert off.trajectory[-1]["action"] != "end"


def test_three_replies_without_action_stop_the_episode(tmp_path):
    ep = run(["dance", "sing", "jump", "navigate to Fridge"], tmp_path)
    assert ep.stop == "no_progress" and ep.steps == 1
    assert [s["action"] for s in ep.trajectory] == ["init", "error", "error", "error", "end"]


def test_aggregate_results(tmp_path):
    ep = run(["end"], tmp_path)
    assert aggregate([ep.result()])["groups"]["transport"]["success"] == 0


def test_everyday_names_match_their_ai2thor_types_and_cupboard_is_no_cup():
    types = ["Fridge", "GarbageCan", "Sofa", "CounterTop", "Cabinet", "Cup", "DiningTable", "Television"]
    for name, kind in [("refrigerator", "Fridge"), ("trash can", "GarbageCan"), ("couch", "Sofa"),
                       ("kitchen counter", "CounterTop"), ("cupboard", "Cabinet"), ("Cupboard", "Cabinet"),
                       ("the fridge", "Fridge"), ("dining table", "DiningTable"), ("cup", "Cup")]:
        assert match_object(name, types) == kind, name
    # A synonym whose type is not in the scene matches nothing rather than a look-alike.
    assert match_object("cupboard", ["Cup", "Fridge"]) is None
    assert parse_decision("<DecisionMaking>navigate to refrigerator</DecisionMaking>", types).obj == "Fridge"
