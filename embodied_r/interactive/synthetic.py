"""A synthetic dataset in the hub's file layouts, played by a scripted expert through the episode loop that
evaluates models, so that its turns are exactly what a model sees."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from embodied_r.interactive import household, prompts
from embodied_r.interactive.episode import EpisodeConfig, run_episodes
from embodied_r.interactive.household import HouseholdEnvironment
from embodied_r.interactive.tasks import TASK_TYPES, key_actions

SURFACES = ("CounterTop", "DiningTable", "Desk", "Shelf", "SideTable")
CONTAINERS = ("Fridge", "Cabinet", "Drawer", "Microwave", "Safe")
SMALL = ("Apple", "Mug", "Book", "KeyChain", "CreditCard", "Tomato", "Pen", "Bowl", "Spoon", "Vase")
APPLIANCES = ("DeskLamp", "Television", "CoffeeMachine", "Toaster", "Faucet")
# The scripted expert's fixed words (a tiny model's tokenizer may keep them whole).
ASK = "Could you help me? "
EXPERT_TEXTS = {
    "goal": "I am in a room; the task names what I need.", "plan": "My plan: ", "plan_end": "; then end.",
    "look": "I do not see everything yet; I will look around.", "looked": "Now I know what is around me.",
    "rush": "I will act at once.",
    "reflect": "That failed: I am too far away. I should go to the object first.",
    "next": "That worked; next: ", "done": "Every step of the task is done.",
}
REPLY_TAGS = ("Observation", "Planning", "Thinking", "DecisionMaking", "Reflection", "Verification")


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
        "taskquery": f"{ASK}{name}", "identity": identity,
        "task_metadata": {"taskname": name, "tasktype": task_type, "actions": [
            {"action": v, "objectType": t, "objectId": f"{t}|1" if t else "", "baseaction": "", "reward": 1,
             "relatedObject": []} for v, t in actions], "totalreward": len(actions)},
        "target_objects": extra.get("target_objects", []), "related_objects": extra.get("related_objects", []),
        # Every navigation target, as the real cases list theirs: a small thing the agent goes
        # straight to is legal only when listed (legality.py).
        "navigable_objects": list(dict.fromkeys(t for v, t in actions if v == "navigate to")),
    }


def make_test_cases(n: int, seed: int = 0, start: int = 1) -> list[dict[str, Any]]:
    return [make_test_case(start + i, TASK_TYPES[i % len(TASK_TYPES)], seed) for i in range(n)]


def _slip(task: dict[str, Any], steps: list[str], r: random.Random) -> tuple[int, str]:
    """Where stage 3's expert tries an interaction before the ``navigate to`` it needs, and which: drawn
    among all such steps, so that a model learns to reflect after feedback, not at a fixed turn."""
    spots = [i for i, k in enumerate(steps[:-1]) if k.startswith("navigate to ")
             and not steps[i + 1].startswith("navigate to ")
             and steps[i + 1].split(" ", 1)[-1] == k.removeprefix("navigate to ")]
    if spots:
        i = r.choice(spots)
        return i, steps[i + 1]
    related = [o.split("|")[0] for o in task.get("related_objects") or []]
    return 0, f"pickup {related[0]}" if related else next((k for k in steps if not k.startswith("navigate")), steps[0])


def expert_replies(task: dict[str, Any], stage: int, r: random.Random) -> list[str]:
    """The scripted expert's replies: the key actions after a plan, each with a thought; stage 2 looks
    around before one step, stage 3 slips once (``_slip``) and reflects."""
    t = EXPERT_TEXTS
    steps = [k for k in key_actions(task) if k != "end"]
    first = (f"<Observation>{t['goal']}</Observation>"
             f"<Planning>{t['plan']}{'; '.join(steps)}{t['plan_end']}</Planning>")
    heads = [first] + [f"<Thinking>{t['next']}{k}.</Thinking>" for k in steps[1:]]
    replies = [f"{h}<DecisionMaking>{k}</DecisionMaking>" for h, k in zip(heads, steps)]
    if stage in (2, 3):
        # One turn aside before a step drawn at random (so a model learns to read the turn it
        # answers, not to count turns), and the step taken up again after it.
        if stage == 2:
            at, aside = r.randrange(len(steps)), "observe"
            thought, resume = t["look"], f"<Observation>{t['looked']}</Observation>"
        else:
            at, aside = _slip(task, steps, r)
            thought, resume = t["rush"], f"<Reflection>{t['reflect']}</Reflection>"
        replies[at:at + 1] = [f"{first if at == 0 else ''}<Thinking>{thought}</Thinking>"
                              f"<DecisionMaking>{aside}</DecisionMaking>",
                              f"{resume}<DecisionMaking>{steps[at]}</DecisionMaking>"]
    replies.append(f"<Verification>{t['done']}</Verification><DecisionMaking>end</DecisionMaking>")
    return replies


def play(tasks: list[dict[str, Any]], stage: int, out: Path, seed: int) -> list[dict[str, Any]]:
    records = []
    for task in tasks:
        replies = iter(expert_replies(task, stage, random.Random(f"{seed}/{task['identity']}")))
        [ep] = run_episodes([task], HouseholdEnvironment, lambda convs: [next(replies) for _ in convs],
                            out / f"stage{stage}", EpisodeConfig(), batch=1)
        records.append({"task": task, "stage": stage, "episode": ep})
    return records


def write_dataset(root: Path, n_train: int = 33, n_test: int = 22, seed: int = 0) -> dict[str, int]:
    """The three files and the images under ``root``, in the hub repo's layout."""
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


def object_types() -> tuple[str, ...]:
    names = (*SURFACES, *CONTAINERS, *SMALL, *APPLIANCES, "SinkBasin", *household.SURFACES, *household.SMALL,
             *household.BIG, *sorted(household.OPENABLE), *sorted(household.TOGGLEABLE))
    return tuple(dict.fromkeys(names))


def fixed_texts() -> tuple[str, ...]:
    """What a tokenizer built for the synthetic sample keeps whole: the fixed words of the agent's
    turns and of the expert's replies, the reply tags and the object types."""
    hole = "\x00"

    def parts(text: str) -> list[str]:
        return [p for p in text.replace(prompts.IMAGE, hole).split(hole) if p.strip()]

    texts = [prompts.SYSTEM, *parts(prompts.first_turn(hole, 0)), *parts(prompts.after_action(hole, 0)),
             *parts(prompts.after_action("move forward", 0)), *parts(prompts.after_failure(hole, hole)),
             *parts(prompts.after_failure(hole, hole, unmatched=True)), prompts.INVALID, prompts.FEEDBACK,
             ASK, *EXPERT_TEXTS.values(), *(f"<{t}>" for t in REPLY_TAGS), *(f"</{t}>" for t in REPLY_TAGS),
             *object_types()]
    return tuple(dict.fromkeys(texts))
