"""A synthetic Embodied-Reasoner dataset in the real file layouts, made in the built-in house.

Test cases follow ``test_809.json``; training trajectories follow ``train_multiturn_9390.json``
(ShareGPT ``messages`` with ``<image>`` markers paired in order with ``images``) and
``data_engine_origin_trajectory_9390.json`` (scene, task type, task name, key actions, the
agent's turns, images). Trajectories are played by a scripted expert through the same
episode loop that evaluates models, so their turns are exactly what a model sees:

- stage 1 (imitation): the key actions, each with an observation or a plan;
- stage 2 (self-exploration): a look around and a detour first, then the key actions;
- stage 3 (self-correction): an illegal action first, its ``<|feedback|>`` turn, a reflection,
  then the key actions.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from embodied_r.interactive.episode import EpisodeConfig, run_episodes
from embodied_r.interactive.household import HouseholdEnvironment
from embodied_r.interactive.tasks import TASK_TYPES, key_actions

SURFACES = ("CounterTop", "DiningTable", "Desk", "Shelf", "SideTable")
CONTAINERS = ("Fridge", "Cabinet", "Drawer", "Microwave", "Safe")
SMALL = ("Apple", "Mug", "Book", "KeyChain", "CreditCard", "Tomato", "Pen", "Bowl", "Spoon", "Vase")
APPLIANCES = ("DeskLamp", "Television", "CoffeeMachine", "Toaster", "Faucet")


def _plan(task_type: str, r: random.Random) -> tuple[str, list[tuple[str, str]], dict[str, Any]]:
    """Task name, key actions and the extra fields of one task of ``task_type``."""
    s, s2 = r.sample(SURFACES, 2)
    c, c2 = r.sample(CONTAINERS, 2)
    o, o2 = r.sample(SMALL, 2)
    a = r.choice(APPLIANCES)
    nav, end = "navigate to", ("end", "")
    extra: dict[str, Any] = {}
    if task_type == "single_search":
        extra = {"target_objects": [f"{s}|1"], "related_objects": [f"{o}|1"]}
        return f"Look for the {o} in the room.", [(nav, s), end], extra
    if task_type == "single_search_from_closerep":
        extra = {"target_objects": [f"{c}|1"], "related_objects": [f"{o}|1"]}
        return f"Find the {o} hidden in the {c}.", [(nav, c), ("open", c), end], extra
    plans = {
        "single_pickup": (f"Pick up the {o}.", [(nav, o), ("pickup", o)]),
        "single_pickup_from_closerep": (f"Take the {o} out of the {c}.",
                                        [(nav, c), ("open", c), ("pickup", o), ("close", c)]),
        "single_toggle": (f"Switch the {a} on.", [(nav, a), ("toggle", a)]),
        "pickup_and_put": (f"Put the {o} on the {s}.", [(nav, o), ("pickup", o), (nav, s), ("put", s)]),
        "pickup_and_put_in_closerep": (f"Put the {o} in the {c}.", [(nav, o), ("pickup", o), (nav, c),
                                                                    ("open", c), ("put", c), ("close", c)]),
        "pickup_from_closerep_and_put": (f"Move the {o} from the {c} to the {s}.",
                                         [(nav, c), ("open", c), ("pickup", o), ("close", c), (nav, s), ("put", s)]),
        "pickup_from_closerep_and_put_in_closerep": (
            f"Move the {o} from the {c} into the {c2}.",
            [(nav, c), ("open", c), ("pickup", o), ("close", c), (nav, c2), ("open", c2), ("put", c2), ("close", c2)]),
        "ordered_pickup_two_object_and_put": (
            f"First put the {o} on the {s}, then put the {o2} on the {s}.",
            [(nav, o), ("pickup", o), (nav, s), ("put", s), (nav, o2), ("pickup", o2), (nav, s), ("put", s)]),
        "long-range tasks with dependency relationships": (
            f"Take the {o} from the {c}, rinse it in the sink, then put it on the {s2}.",
            [(nav, c), ("open", c), ("pickup", o), ("close", c), (nav, "SinkBasin"), ("put", "SinkBasin"),
             ("toggle", "Faucet"), ("pickup", o), (nav, s2), ("put", s2)]),
    }
    name, actions = plans[task_type]
    return name, actions + [end], extra


def make_test_case(identity: int, task_type: str, seed: int) -> dict[str, Any]:
    r = random.Random(f"{seed}/{identity}")
    name, actions, extra = _plan(task_type, r)
    scene = f"House{1 + identity % 5}"
    return {
        "scene": scene, "tasktype": task_type, "instruction_idx": identity, "taskname": name,
        "taskquery": f"Could you help me? {name}", "identity": identity,
        "task_metadata": {"taskname": name, "tasktype": task_type, "actions": [
            {"action": v, "objectType": t, "objectId": f"{t}|1" if t else "", "baseaction": "", "reward": 1,
             "relatedObject": []} for v, t in actions], "totalreward": len(actions)},
        "target_objects": extra.get("target_objects", []), "related_objects": extra.get("related_objects", []),
        # Every navigation target, as the real cases list theirs: a small thing the agent goes
        # straight to is legal only when listed (legality.py).
        "navigable_objects": list(dict.fromkeys(t for v, t in actions if v == "navigate to")),
    }


def make_test_cases(n: int, seed: int = 0, start: int = 1) -> list[dict[str, Any]]:
    """``n`` cases cycling through the 11 task types."""
    return [make_test_case(start + i, TASK_TYPES[i % len(TASK_TYPES)], seed) for i in range(n)]


def expert_replies(task: dict[str, Any], stage: int, r: random.Random) -> list[str]:
    """The scripted expert's replies for one task at one stage."""
    keys = key_actions(task)
    steps = [k for k in keys if k != "end"]
    goal = task["taskname"].rstrip(".").lower()
    replies = []
    first = (f"<Observation>I am in a room and must {goal}.</Observation>"
             f"<Planning>My plan: {'; '.join(steps)}; then end.</Planning>")
    prefix = [first]
    if stage == 2:
        replies.append(first + "<Thinking>I do not see everything yet; I will look around.</Thinking>"
                               "<DecisionMaking>observe</DecisionMaking>")
        prefix = ["<Observation>Now I know what is around me.</Observation>"]
    if stage == 3:
        wrong = next((k for k in steps if not k.startswith("navigate to")), steps[-1])
        replies.append(first + f"<Thinking>I will act at once.</Thinking><DecisionMaking>{wrong}</DecisionMaking>")
        prefix = ["<Reflection>That failed: I am too far away. I should go to the object first.</Reflection>"]
    for i, k in enumerate(steps):
        head = prefix[0] if i == 0 else f"<Thinking>That worked; next: {k}.</Thinking>"
        replies.append(f"{head}<DecisionMaking>{k}</DecisionMaking>")
    replies.append("<Verification>Every step of the task is done.</Verification><DecisionMaking>end</DecisionMaking>")
    return replies


def play(tasks: list[dict[str, Any]], stage: int, out: Path, seed: int) -> list[dict[str, Any]]:
    """Run the expert through the built-in house; returns one record per trajectory with
    absolute image paths (made relative by the writer)."""
    records = []
    for task in tasks:
        replies = iter(expert_replies(task, stage, random.Random(f"{seed}/{task['identity']}")))
        [ep] = run_episodes([task], HouseholdEnvironment, lambda convs: [next(replies) for _ in convs],
                            out / f"stage{stage}", EpisodeConfig(), batch=1)
        records.append({"task": task, "stage": stage, "episode": ep})
    return records


def write_dataset(root: Path, n_train: int = 33, n_test: int = 22, seed: int = 0) -> dict[str, int]:
    """The three files and the images under ``root`` (the hub repo's layout)."""
    import json

    root = Path(root)
    images = root / "data" / "images"
    tests = make_test_cases(n_test, seed + 1, start=1)
    train_tasks = make_test_cases(n_train, seed, start=10_001)
    multiturn, origin = [], []
    for stage in (1, 2, 3):
        # Stage 2 and 3 have more trajectories than stage 1 in the paper; a third each here.
        chunk = train_tasks[(stage - 1)::3]
        for rec in play(chunk, stage, images, seed):
            ep, task = rec["episode"], rec["task"]
            if ep.result()["success"] != 1:
                raise RuntimeError(f"the expert failed task {task['identity']} at stage {stage}")
            rel = [str(Path(p).relative_to(root)) for p in ep.images]
            uid = f"synthetic-{stage}-{task['identity']}"
            multiturn.append({"id": uid, "messages": ep.messages, "images": rel})
            origin.append({"id": uid, "stage": stage, "scene": task["scene"], "tasktype": task["tasktype"],
                           "taskname": task["taskname"], "taskquery": task["taskquery"],
                           "key_actions": task["task_metadata"]["actions"], "task": task,
                           "trajectory": [m["content"] for m in ep.messages if m["role"] == "assistant"],
                           "images": rel})
    (root / "train_multiturn.json").write_text(json.dumps(multiturn, indent=1))
    (root / "data_engine_origin_trajectory.json").write_text(json.dumps(origin, indent=1))
    (root / "test.json").write_text(json.dumps(tests, indent=1))
    return {"trajectories": len(multiturn), "test_cases": len(tests),
            "images": sum(len(m["images"]) for m in multiturn)}
