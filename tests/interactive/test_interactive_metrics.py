"""Embodied-Reasoner episode metrics: one test per rule of the original evaluator, and the
real test_809.json counted (skipped with the reason where ../shared is absent)."""

from __future__ import annotations

import pytest

from embodied_r.interactive import tasks
from embodied_r.interactive.metrics import (aggregate, episode_metrics, extra_metrics, flat_metrics, lcs_length,
                                            table2, total_reward)


def step(action, obj=None, ok=1, legal=()):
    return {"action": action, "object": obj, "legal_objects": list(legal), "success": ok}


INIT = step("init")
END = step("end", legal=["Fridge"])


def case(task_type="pickup_and_put", name="put the apple in the fridge"):
    return {"tasktype": task_type, "taskname": name, "identity": 1}


TRANSPORT_KEYS = ["navigate to Apple", "pickup Apple", "navigate to Fridge", "open Fridge", "put Fridge", "end"]


def test_total_counts_end_and_interactions_but_not_moves():
    assert total_reward(TRANSPORT_KEYS) == 4
    assert total_reward(["navigate to CounterTop", "end"]) == 1
    assert total_reward(["observe", "move forward", "end"]) == 1


def test_perfect_episode_succeeds_with_efficiency_key_actions_plus_one_over_steps():
    traj = [INIT, step("navigate to", "Apple"), step("pickup", "Apple"), step("navigate to", "Fridge"),
            step("open", "Fridge"), step("put", "Fridge"), END]
    m = episode_metrics(case(), traj, TRANSPORT_KEYS)
    assert m == {"success": 1, "efficiency": 7 / 7, "completeness": 1.0}


def test_detours_lower_efficiency_only():
    traj = [INIT, step("observe"), step("navigate to", "Apple"), step("pickup", "Apple"),
            step("navigate to", "Fridge"), step("open", "Fridge"), step("put", "Fridge"), END]
    m = episode_metrics(case(), traj, TRANSPORT_KEYS)
    assert m["success"] == 1 and m["completeness"] == 1.0 and m["efficiency"] == pytest.approx(7 / 8)


def test_put_in_counts_as_put():
    traj = [INIT, step("pickup", "Apple"), step("open", "Fridge"), step("put in", "Fridge"), END]
    assert episode_metrics(case(), traj, TRANSPORT_KEYS)["success"] == 1


def test_key_actions_match_in_any_order():
    traj = [INIT, step("open", "Fridge"), step("pickup", "Apple"), step("put", "Fridge"), END]
    assert episode_metrics(case(), traj, TRANSPORT_KEYS)["completeness"] == 1.0


def test_failed_and_unmatched_steps_score_nothing_and_failure_has_zero_efficiency():
    traj = [INIT, step("pickup", "Apple"), step("open", "Fridge", ok=0), step("pickup", "Mug"),
            step("put", "Fridge", ok=0), END]
    m = episode_metrics(case(), traj, TRANSPORT_KEYS)
    assert m == {"success": 0, "efficiency": 0.0, "completeness": 2 / 4}


def test_a_key_action_scores_once_per_occurrence():
    keys = ["pickup Lettuce", "put Pan", "pickup Lettuce", "end"]
    once = [INIT, step("pickup", "Lettuce"), step("pickup", "Lettuce"), step("pickup", "Lettuce"), END]
    assert episode_metrics(case("long-range tasks with dependency relationships"), once, keys)["completeness"] == 3 / 4


def test_failed_end_is_a_failure_even_with_every_interaction_done():
    traj = [INIT, step("pickup", "Apple"), step("open", "Fridge"), step("put", "Fridge"), step("end", ok=0)]
    m = episode_metrics(case(), traj, TRANSPORT_KEYS)
    assert m["success"] == 0 and m["completeness"] == 3 / 4


SEARCH_KEYS = ["navigate to CounterTop", "end"]


def test_single_search_end_scores_when_a_legal_object_is_named_in_the_task():
    task = case("single_search", "Could you help me look for the CreditCard in the room?")
    traj = [INIT, step("navigate to", "Cabinet"), step("end", legal=["Cabinet", "CreditCard"])]
    assert episode_metrics(task, traj, SEARCH_KEYS) == {"success": 1, "efficiency": 1.0, "completeness": 1.0}


def test_single_search_end_scores_when_the_last_successful_action_is_a_key_action():
    task = case("single_search", "Find the card")
    traj = [INIT, step("navigate to", "CounterTop"), step("pickup", "Cup", ok=0), step("end", legal=["Cup"])]
    m = episode_metrics(task, traj, SEARCH_KEYS)
    assert m["success"] == 1 and m["efficiency"] == pytest.approx(3 / 4)


def test_single_search_end_scores_nothing_otherwise():
    task = case("single_search", "Find the card")
    traj = [INIT, step("navigate to", "CounterTop"), step("navigate to", "Sink"), step("end", legal=["Sink"])]
    assert episode_metrics(task, traj, SEARCH_KEYS) == {"success": 0, "efficiency": 0.0, "completeness": 0.0}


def test_the_search_end_rule_is_for_single_search_only():
    task = case("single_search_from_closerep", "Find the card")
    traj = [INIT, step("navigate to", "Sink"), step("end", legal=["Sink"])]
    assert episode_metrics(task, traj, SEARCH_KEYS)["success"] == 1


def test_aggregation_by_group_and_type_and_table():
    rows = [{"tasktype": "single_search", "success": 1, "efficiency": 1.0, "completeness": 1.0},
            {"tasktype": "pickup_and_put", "success": 0, "efficiency": 0.0, "completeness": 0.5},
            {"tasktype": "pickup_and_put", "success": 1, "efficiency": 0.5, "completeness": 1.0}]
    summary = aggregate(rows)
    assert summary["all"]["success"] == pytest.approx(2 / 3)
    assert summary["groups"]["transport"] == {"success": 0.5, "efficiency": 0.25, "completeness": 0.75,
                                              "episodes": 2}
    flat = flat_metrics(summary)
    assert flat["success/search"] == 1.0 and "completeness/type/pickup_and_put" in flat
    assert "80.96" in table2(summary) and "| transport | 2 |" in table2(summary)


def test_groups_cover_the_eleven_types_and_step_limits():
    assert len(tasks.TASK_TYPES) == 11
    assert [tasks.step_limit(t) for t in ("single_search", "single_toggle", "pickup_and_put",
                                          "ordered_pickup_two_object_and_put",
                                          "long-range tasks with dependency relationships")] == [22, 24, 30, 36, 36]
    assert tasks.step_limit("single_pickup_navigate_fault") == 24


REAL = tasks.shared_test_file()


@pytest.mark.skipif(REAL is None, reason="../shared/benchmarks/embodied-reasoner/test_809.json is not beside "
                                         "this checkout")
def test_real_test_809_parses_with_its_groups_and_key_actions():
    cases = tasks.load_test_cases(REAL)
    c = tasks.counts(cases)
    assert c["cases"] == 809 and c["scenes"] == 16
    assert c["groups"] == tasks.GROUP_COUNTS == {"search": 155, "manipulation": 299, "transport": 250,
                                                 "composite": 105}
    assert set(c["task_types"]) == set(tasks.TASK_TYPES)
    assert c["verbs"] == {"navigate to": 1432, "end": 809, "pickup": 747, "put": 505, "open": 364,
                          "close": 138, "toggle": 97}
    assert all(tasks.key_actions(x)[-1] == "end" for x in cases)
    assert tasks.key_actions(cases[0]) == ["navigate to CounterTop", "end"]
    # A perfect replay of the key actions scores 1/1/1, except in 13 long-range cases whose
    # metadata holds a bare "put" (no object type): the original metric can never match it.
    unreachable = []
    for x in cases:
        keys = tasks.key_actions(x)
        traj = [step("init")] + [step(*k.rsplit(" ", 1)) if " " in k else step(k) for k in keys[:-1]]
        m = episode_metrics(x, traj + [step("end", legal=[])], keys)
        if m != {"success": 1, "efficiency": 1.0, "completeness": 1.0}:
            unreachable.append(x["identity"])
            assert "put" in keys and x["tasktype"].startswith("long-range")
    assert unreachable == [786, 787, 788, 789, 790, 791, 792, 793, 794, 796, 797, 798, 799]


# The original's extra figures (its result script), each case computed by hand.

def test_lcs_length_hand_cases():
    assert lcs_length([], ["a"]) == 0
    assert lcs_length(["a", "b", "c"], ["a", "b", "c"]) == 3
    assert lcs_length(["b", "a", "c"], ["a", "b", "c"]) == 2  # "a c" or "b c"
    assert lcs_length(["x", "a", "y", "b"], ["a", "b", "z"]) == 2


def test_ordered_completeness_is_the_common_subsequence_with_the_key_actions():
    # put and open score out of order: scored = [put Fridge, open Fridge, end]; the ordered
    # keys are [pickup Apple, open Fridge, put Fridge, end] -> LCS 2 ("open Fridge", "end") of 4.
    keys = ["navigate to Apple", "pickup Apple", "navigate to Fridge", "open Fridge", "put Fridge", "end"]
    traj = [INIT, step("navigate to", "Fridge"), step("put", "Fridge"), step("open", "Fridge"),
            step("pickup", "Apple", ok=0), END]
    m = extra_metrics(case(), traj, keys)
    assert m["completeness_ordered"] == 2 / 4
    assert episode_metrics(case(), traj, keys)["completeness"] == 3 / 4  # the plain one ignores order


def test_ordered_completeness_of_single_search_is_the_completeness():
    task = case("single_search", "Find the mug")
    traj = [INIT, step("navigate to", "Sink"), step("end", legal=["Mug"])]
    assert extra_metrics(task, traj, ["navigate to Sink", "end"])["completeness_ordered"] == 1.0


def test_repeat_rate_counts_navigations_to_an_object_seen_before():
    traj = [INIT, step("navigate to", "Fridge"), step("navigate to", "Sink", ok=0), step("navigate to", "Fridge"),
            step("navigate to", "Fridge"), step("observe"), END]
    # 4 navigations, 2 distinct objects: (4 - 2) / 4; a failed one counts too.
    assert extra_metrics(case(), traj, TRANSPORT_KEYS)["repeat_rate"] == 0.5
    assert extra_metrics(case(), [INIT, END], TRANSPORT_KEYS)["repeat_rate"] == 0.0


def test_key_action_steps_and_success_by_their_number():
    assert extra_metrics(case(), [INIT, END], TRANSPORT_KEYS)["key_action_steps"] == 5
    closed = case("single_search_from_closerep", "Find the card")
    assert extra_metrics(closed, [INIT, END], ["navigate to Drawer", "open Drawer", "open Box", "end"]
                         )["key_action_steps"] == 2  # the original's fixed 2
    rows = [{"tasktype": "pickup_and_put", "success": 1, "efficiency": 1.0, "completeness": 1.0,
             "key_action_steps": 5},
            {"tasktype": "pickup_and_put", "success": 0, "efficiency": 0.0, "completeness": 0.5,
             "key_action_steps": 5},
            {"tasktype": "single_search", "success": 1, "efficiency": 1.0, "completeness": 1.0,
             "key_action_steps": 1},
            {"tasktype": "long-range tasks with dependency relationships", "success": 0, "efficiency": 0.0,
             "completeness": 0.1, "key_action_steps": 12}]
    by = aggregate(rows)["by_key_actions"]
    assert list(by) == ["1", "5", "9+"]
    assert by["5"] == {"success": 0.5, "episodes": 2} and by["9+"] == {"success": 0.0, "episodes": 1}
    assert flat_metrics(aggregate(rows))["success/key_actions/9_plus"] == 0.0


def test_dropped_episodes_are_left_out_of_every_mean_and_counted():
    rows = [{"tasktype": "pickup_and_put", "success": 1, "efficiency": 1.0, "completeness": 1.0},
            {"tasktype": "pickup_and_put", "success": 0, "efficiency": 0.0, "completeness": 0.0, "dropped": True},
            {"tasktype": "single_search", "success": 0, "efficiency": 0.0, "completeness": 0.0, "dropped": True}]
    summary = aggregate(rows)
    assert summary["episodes"] == 1 and summary["all"]["success"] == 1.0
    assert summary["dropped"] == 2 and summary["dropped_by_type"] == {"pickup_and_put": 1, "single_search": 1}
    assert flat_metrics(summary)["dropped"] == 2
    assert "Dropped (failed generation, left out of every mean): 2 episodes" in table2(summary)


def test_report_shows_the_extra_figures_beside_table2():
    rows = [{"tasktype": "pickup_and_put", "success": 1, "efficiency": 0.5, "completeness": 1.0,
             "completeness_ordered": 0.75, "repeat_rate": 0.25, "key_action_steps": 5}]
    text = table2(aggregate(rows))
    assert "| transport | 1 | 100.00 | 50.00 | 100.00 | 75.00 | 25.00 |" in text
    assert "| 5 | 1 | 100.00 |" in text
