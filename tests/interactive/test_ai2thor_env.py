"""The AI2-THOR adapter against a fake controller (tests/ai2thor_fake.py): ai2thor 5.0.0's
metadata shape, the simulator itself never run. One test per rule of the original agent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from embodied_r.errors import PosesError
from embodied_r.interactive.ai2thor_env import AI2ThorEnvironment
from embodied_r.interactive.ai2thor_poses import load_poses
from embodied_r.interactive.env_factory import EnvironmentMaker
from embodied_r.interactive.episode import EpisodeConfig, run_episodes
from tests.ai2thor_fake import FakeController

CHECKOUT = Path(__file__).resolve().parents[1] / "fixtures" / "embodied_reasoner_checkout"
COUNTER, APPLE = "CounterTop|+01.50|+00.45|+00.00", "Apple|+01.50|+00.95|+00.50"


def _task(scene: str = "FloorPlan1", identity: int = 1, **extra):
    return {"scene": scene, "identity": identity, "tasktype": "single_search", "taskname": "Find the Apple.",
            "taskquery": f"Task {identity}: find the Apple.", "task_metadata": {"actions": [
                {"action": "navigate to", "objectType": "CounterTop"}, {"action": "end", "objectType": ""}]},
            "target_objects": [COUNTER], "related_objects": [APPLE], "navigable_objects": ["Fridge"], **extra}


@pytest.fixture
def env(tmp_path):
    controller = FakeController()
    environment = AI2ThorEnvironment(controller, load_poses(CHECKOUT))
    return environment, controller


def _actions(controller: FakeController, since: int = 0) -> list[str]:
    return [c["action"] for c in controller.calls[since:]]


def test_start_pose_is_the_corner_nearest_position_facing_into_the_room_at_horizon_0(env, tmp_path):
    environment, c = env
    assert environment.reset(_task(), tmp_path).success
    assert (c.agent["position"]["x"], c.agent["position"]["z"]) == (1.75, 1.75)
    assert (c.agent["rotation"]["y"], c.agent["cameraHorizon"]) == (225.0, 0.0)
    c.blocked_teleports.append((1.75, 1.75))  # that teleport fails: the next corner's position
    environment.reset(_task(), tmp_path)
    assert (c.agent["position"]["x"], c.agent["position"]["z"], c.agent["rotation"]["y"]) == (1.75, -1.75, 315.0)


def test_navigating_to_what_was_never_seen_navigable_is_refused_without_acting(env, tmp_path):
    environment, c = env
    environment.reset(_task(), tmp_path)
    since = len(c.calls)
    for kind in ("Egg", "Apple"):  # inside the closed fridge; small and across the room
        result = environment.step("navigate to", kind)
        assert not result.success and "not navigable" in result.feedback
    assert _actions(c, since) == []


def test_interaction_needs_the_object_among_the_legal_interactions(env, tmp_path):
    environment, c = env
    environment.reset(_task(), tmp_path)
    since = len(c.calls)
    assert not environment.step("pickup", "Apple").success
    assert "PickupObject" not in _actions(c, since)
    assert environment.step("navigate to", "CounterTop").success
    assert environment.step("pickup", "Apple").success


def test_navigation_redirects_to_the_related_object_and_turns_toward_it(env, tmp_path):
    environment, c = env
    environment.reset(_task(), tmp_path)
    since = len(c.calls)
    result = environment.step("navigate to", "CounterTop")
    teleport = next(x for x in c.calls[since:] if x["action"] == "Teleport")
    assert teleport["horizon"] == 60
    # The apple on the counter, not the counter's centre: the nearest pose, facing it.
    assert (c.agent["position"]["x"], c.agent["position"]["z"]) == (1.0, 0.5)
    # Looking at it: from horizon 60 up to the 51 degrees down the apple's centre lies at.
    assert c.agent["rotation"]["y"] == 90.0 and c.agent["cameraHorizon"] == 51
    assert "Apple" in result.legal_objects  # what the single-search end rule reads


def test_hand_made_pose_of_the_checkout_is_used_as_it_is(env, tmp_path):
    environment, c = env
    environment.reset(_task(), tmp_path)
    since = len(c.calls)
    assert environment.step("navigate to", "Fridge").success
    assert "GetInteractablePoses" not in _actions(c, since)
    assert (c.agent["position"]["x"], c.agent["position"]["z"], c.agent["rotation"]["y"],
            c.agent["cameraHorizon"]) == (-0.75, 1.5, 270.0, 0.0)


def test_a_missing_poses_file_is_a_one_line_error_naming_it(tmp_path):
    for where in (tmp_path, None):
        with pytest.raises(PosesError) as err:
            EnvironmentMaker("ai2thor", where, start_controller=FakeController)
        assert "\n" not in str(err.value) and "agent_positions.json" in str(err.value)


def test_a_failed_teleport_retries_the_next_candidate(env, tmp_path):
    environment, c = env
    environment.reset(_task(), tmp_path)
    c.blocked_teleports.append((1.0, 0.5))  # the apple's nearest pose
    since = len(c.calls)
    assert environment.step("navigate to", "CounterTop").success
    assert _actions(c, since).count("Teleport") == 2
    assert (c.agent["position"]["x"], c.agent["position"]["z"]) != (1.0, 0.5)
    # The pose faced the apple square to the grid; turning toward it takes the diagonal.
    assert c.calls[since + 2]["rotation"]["y"] == 90 and c.agent["rotation"]["y"] == 45.0
    assert c.calls[since + 2]["horizon"] == 60  # the retry too, as the original's teleport helper


def test_agent_crouches_for_a_low_object(env, tmp_path):
    environment, c = env
    environment.reset(_task(navigable_objects=["Toaster"]), tmp_path)
    assert environment.step("navigate to", "Toaster").success
    assert c.agent["isStanding"] is False
    assert environment.step("toggle", "Toaster").success


def _place(c: FakeController, x: float, z: float, yaw: float) -> None:
    c.step(action="Teleport", position=dict(x=x, y=0.9, z=z), rotation=dict(x=0, y=yaw, z=0))


def test_blocked_move_forward_steps_sideways_then_back_then_turns(env, tmp_path):
    environment, c = env
    environment.reset(_task(related_objects=[]), tmp_path)
    _place(c, 0.0, -1.75, 180.0)  # facing the wall
    assert environment.step("move forward").success
    assert (c.agent["position"]["x"], c.agent["position"]["z"], c.agent["rotation"]["y"]) == (-0.5, -1.75, 180.0)
    _place(c, 0.0, -1.75, 180.0)
    c.walls |= {(-0.5, -1.75), (0.5, -1.75)}  # both sides blocked: a step back
    assert environment.step("move forward").success
    assert (c.agent["position"]["x"], c.agent["position"]["z"]) == (0.0, -1.25)
    _place(c, 0.0, -1.75, 180.0)
    c.walls |= {(0.0, -1.25)}  # and behind: it turns right, tries ahead, turns about, tries ahead
    since = len(c.calls)
    result = environment.step("move forward")
    assert not result.success and result.images == []
    assert _actions(c, since)[-4:] == ["RotateRight", "MoveAhead", "RotateLeft", "MoveAhead"]
    assert c.calls[-2]["degrees"] == 180 and c.agent["rotation"]["y"] == 90.0


def test_blocked_move_forward_steps_toward_the_nearer_related_object(env, tmp_path):
    environment, c = env
    environment.reset(_task(), tmp_path)
    _place(c, 1.0, -1.75, 90.0)  # facing the wall-side counter end; the apple ahead-left
    c.walls.add((1.5, -1.75))
    c.objects[2]["position"] = dict(x=1.5, y=0.95, z=-1.0)  # the apple, visible ahead
    assert environment.step("move forward").success
    assert (c.agent["position"]["x"], c.agent["position"]["z"], c.agent["rotation"]["y"]) == (1.0, -1.25, 90.0)


def test_observe_is_three_labelled_views_side_by_side_the_middle_framed(env, tmp_path):
    environment, c = env
    environment.reset(_task(), tmp_path)
    yaw, since = c.agent["rotation"]["y"], len(c.calls)
    assert "Toaster" not in environment.legality.navigable  # to the agent's left
    result = environment.step("observe")
    assert _actions(c, since) == ["RotateLeft"] * 4 and c.agent["rotation"]["y"] == yaw
    [path] = result.images
    image = np.asarray(Image.open(path))
    assert Image.open(path).format == "PNG" and image.shape[:2] == (45, 3 * 80 + 10)
    assert not image[:, 80:85].any() and not image[:, 165:170].any()  # the middle view's frame
    left = image[:, :80]
    assert (left[:, :, 2] > left[:, :, 0] + 100).any()  # the blue "left view" label
    # What the agent turned to see is navigable now.
    assert "Toaster" in environment.legality.navigable


def test_each_running_episode_has_its_own_controller(tmp_path):
    started: list[FakeController] = []

    def start() -> FakeController:
        started.append(FakeController())
        return started[-1]

    kitchen = _task("FloorPlan1", 1)
    bedroom = _task("FloorPlan301", 2, target_objects=[], related_objects=[], navigable_objects=[])
    third = _task("FloorPlan1", 3)
    goal = {1: "CounterTop", 2: "Bed", 3: "CounterTop"}

    def generate(conversations):
        replies = []
        for conv in conversations:
            identity = int(next(m for m in conv if m["role"] == "user")["content"][-1]["text"].split("Task ")[1][0])
            done = any(m["role"] == "assistant" for m in conv)
            replies.append("<DecisionMaking>end</DecisionMaking>" if done else
                           f"<DecisionMaking>navigate to {goal[identity]}</DecisionMaking>")
        return replies

    maker = EnvironmentMaker("ai2thor", CHECKOUT, start_controller=start)
    episodes = run_episodes([kitchen, bedroom, third], maker, generate, tmp_path, EpisodeConfig(), batch=2)
    for e in episodes:
        [nav] = [s for s in e.trajectory if s["action"] == "navigate to"]
        assert nav["success"] == 1, (e.task["scene"], nav)
    assert len(started) == 2  # the third episode reused a finished one's controller
    maker.close()
    assert all(c.stopped for c in started)


def test_eight_position_search_stands_a_large_object_off_in_line_with_its_front(env, tmp_path):
    environment, c = env
    environment.reset(_task(related_objects=[]), tmp_path)
    since = len(c.calls)
    assert environment.step("navigate to", "CounterTop").success
    assert _actions(c, since)[:2] == ["GetInteractablePoses", "Teleport"]
    # The counter faces -x (heading 270): in line with its centre, on that side, the farthest
    # pose within 1 m; crouched (its base is on the floor), turned toward it, tilted to its centre.
    assert (c.agent["position"]["x"], c.agent["position"]["z"]) == (0.5, 0.0)
    assert (c.agent["isStanding"], c.agent["rotation"]["y"], c.agent["cameraHorizon"]) == (False, 90.0, 33)


def _box(heading: float, size: float = 1.0) -> dict:
    return {"position": dict(x=0.0, y=0.5, z=0.0), "rotation": dict(x=0.0, y=heading, z=0.0),
            "axisAlignedBoundingBox": {"size": dict(x=size, y=size, z=size)}}


def test_eight_position_search_prefers_the_side_the_object_faces():
    from embodied_r.interactive.ai2thor_poses import navigation_pose

    ahead, behind = dict(x=0.0, y=0.9, z=0.5, rotation=0), dict(x=0.0, y=0.9, z=-0.9, rotation=0)
    assert navigation_pose(_box(0), [behind, ahead]) == (ahead, 180)  # facing +z: stand at +z, look back
    assert navigation_pose(_box(180), [behind, ahead]) == (behind, 0)
    front, back = dict(x=0.5, y=0.9, z=0.5, rotation=0), dict(x=-0.6, y=0.9, z=-0.6, rotation=0)
    assert navigation_pose(_box(44), [back, front]) == (front, 225)  # a diagonal: its quadrant
    assert navigation_pose(_box(44), [back, front], tried=[front]) == (back, 45)  # then behind it
