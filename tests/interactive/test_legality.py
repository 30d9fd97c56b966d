"""The original agent's legality rules, one test per rule, and the built-in house under them."""

from __future__ import annotations

from embodied_r.interactive.household import HouseholdEnvironment
from embodied_r.interactive.legality import Legality, Seen, interactions_now, is_navigable, seen_in


def _seen(kind: str, size: tuple[float, float, float], d: float, visible: bool = True) -> Seen:
    return Seen(f"{kind}|1", kind, visible, size, d)


def test_big_object_is_navigable_from_across_the_room_and_never_when_hidden():
    fridge = (0.7, 1.8, 0.7)  # 0.88 m³: volume over distance stays above 0.02 to 40 m
    assert is_navigable(_seen("Fridge", fridge, 8.0))
    assert not is_navigable(_seen("Fridge", fridge, 8.0, visible=False))


def test_small_object_is_navigable_only_close_by():
    apple = (0.08, 0.08, 0.08)  # 0.0005 m³, faces of 0.0064 m²: only the 1 m rule applies
    assert is_navigable(_seen("Apple", apple, 0.9))
    assert not is_navigable(_seen("Apple", apple, 1.2))
    mug = (0.12, 0.12, 0.12)  # 0.0017 m³: navigable within 1.5 m
    assert is_navigable(_seen("Mug", mug, 1.4)) and not is_navigable(_seen("Mug", mug, 1.6))


def test_flat_small_object_counts_by_its_largest_face():
    towel = (0.6, 0.02, 0.5)  # 0.006 m³ but a 0.3 m² face: within 4 m
    assert is_navigable(_seen("Towel", towel, 3.5))
    assert not is_navigable(_seen("Towel", towel, 4.5))


def test_big_object_too_far_for_its_volume_falls_back_to_the_face_tiers():
    shelf = (0.1, 0.3, 0.4)  # 0.012 m³, largest face 0.12 m²: volume over distance is 0.012/d
    assert is_navigable(_seen("Shelf", shelf, 0.5))  # rate 0.024, above 0.02
    assert is_navigable(_seen("Shelf", shelf, 2.4))  # face above 0.08 within 2.5 m
    assert not is_navigable(_seen("Shelf", shelf, 2.6))


def test_seen_in_reads_ai2thor_metadata_and_skips_the_floor():
    box = {"center": {"x": 3.0, "y": 0.5, "z": 4.0}, "size": {"x": 1.0, "y": 1.0, "z": 1.0}}
    meta = {"agent": {"position": {"x": 0.0, "y": 0.9, "z": 0.0}},
            "objects": [{"objectId": "Floor|0", "objectType": "Floor", "visible": True, "axisAlignedBoundingBox": box},
                        {"objectId": "Sofa|1", "objectType": "Sofa", "visible": True, "axisAlignedBoundingBox": box}]}
    [sofa] = seen_in(meta)
    assert (sofa.type, sofa.distance, sofa.size) == ("Sofa", 5.0, (1.0, 1.0, 1.0))


def test_navigable_list_starts_from_the_task_and_only_grows():
    rules = Legality.for_task({"navigable_objects": ["Cabinet", "Cabinet", "Drawer"]})
    assert rules.navigable == ["Cabinet", "Drawer"]
    rules.observe([_seen("Apple", (0.08, 0.08, 0.08), 0.5)])
    rules.observe([_seen("Apple", (0.08, 0.08, 0.08), 5.0)])  # out of reach again: still listed
    assert rules.allows("navigate to", "Apple") and rules.allows("navigate to", "Drawer")
    assert not rules.allows("navigate to", "Sofa")


def test_interactions_are_what_is_navigable_now_or_visible_in_the_container():
    egg, far = (0.05, 0.06, 0.05), 3.0
    assert interactions_now([_seen("Egg", egg, far)], container=[]) == []
    assert interactions_now([_seen("Egg", egg, far)], container=["Egg"]) == ["Egg"]
    assert interactions_now([_seen("Egg", egg, far, visible=False)], container=["Egg"]) == []
    rules = Legality.for_task({"navigable_objects": ["Egg"]})
    rules.observe([_seen("Egg", egg, far)])
    # Navigable by the task's list is not enough to touch it: interactions are recomputed.
    assert rules.allows("navigate to", "Egg") and not rules.allows("pickup", "Egg")
    assert rules.legal_objects == []
    rules.enter(["Egg"])
    rules.observe([_seen("Egg", egg, far)])
    assert rules.allows("pickup", "Egg") and rules.legal_objects == ["Egg"]
    assert rules.allows("observe", None) and not rules.allows("pickup", None)


def _task(**extra):
    actions = [{"action": "navigate to", "objectType": "CounterTop"}, {"action": "pickup", "objectType": "Apple"},
               {"action": "end", "objectType": ""}]
    return {"scene": "House1", "identity": 1, "tasktype": "single_pickup", "taskname": "Pick up the Apple.",
            "task_metadata": {"actions": actions}, "navigable_objects": ["CounterTop"], **extra}


def test_built_in_house_refuses_a_small_thing_across_the_room_until_the_agent_stood_by_it(tmp_path):
    env = HouseholdEnvironment(width=32, height=18)
    env.reset(_task(), tmp_path)
    refused = env.step("navigate to", "Apple")
    assert not refused.success and "not navigable" in refused.feedback
    assert not env.step("pickup", "Apple").success  # not yet legal: across the room
    assert env.step("navigate to", "CounterTop").success
    assert "Apple" in env.legal_objects()
    assert env.step("pickup", "Apple").success
    env.step("navigate to", "CounterTop")
    # Once seen navigable it stays so, as in the original.
    assert "Apple" in env.legality.navigable


def test_built_in_house_lets_the_task_list_make_a_small_thing_navigable(tmp_path):
    env = HouseholdEnvironment(width=32, height=18)
    env.reset(_task(navigable_objects=["CounterTop", "Apple"]), tmp_path)
    assert env.step("navigate to", "Apple").success
