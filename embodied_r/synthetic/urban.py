"""UrbanVideo-Bench-style flights: a random plan of turns, climbs and straight flights cut into
clips (its prefixes) that share a scene, as the real clips do; answers from the plan and
per-frame visibility, questions in the real ``MCQ.parquet`` text shapes."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from embodied_r.benchmarks import urbanvideo
from embodied_r.benchmarks.base import arrow_schema
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.synthetic.config import SyntheticConfig
from embodied_r.synthetic.filming import Crew, Shot
from embodied_r.synthetic.truth import fact, side, video_truth, write_facts, write_truth
from embodied_r.synthetic.world import (LETTERS, Balancer, Pose, Segment, Thing, backdrop, options, pose_at, visibility,
                                         wrap180)


URBAN_THINGS = [("red", "cube"), ("blue", "cylinder"), ("green", "sphere"), ("yellow", "cone"),
                ("purple", "cube"), ("orange", "cylinder"), ("white", "sphere"), ("cyan", "cone")]
AG_OPTION = {"rise": "I rise.", "descend": "I descend.", "fly forward": "I fly forward.",
             "fly backward": "I fly backward.", "turn left": "I turn left.", "turn right": "I turn right."}
AG_DISTRACTORS = ["I rotate the camera upward.", "I rotate the camera downward."]
# Under option_order "fixed", the closed sets in their one order: seven moves for Action
# Generation (as many options as the shuffled questions have), the four places of a landmark.
AG_FIXED = [*AG_OPTION.values(), AG_DISTRACTORS[0]]
LP_PLACES = ["ahead of me", "on my left", "on my right", "behind me"]
ACTION_NOUN = {"rise": "ascent", "descend": "descent", "fly forward": "forward flight",
               "fly backward": "backward flight", "turn left": "turn to the left",
               "turn right": "turn to the right"}


def _mcq(question: str, options: Sequence[str], header: str) -> str:
    """The two shapes real MCQ.parquet rows use: navigation tasks say 'choose:'."""
    body = "".join(f"{LETTERS[i]}. {o}  \n" for i, o in enumerate(options)).rstrip("\n")
    if header == "choose":
        return f"Question: {question}  \nchoose:  \n{body}"
    return f"Question: {question}\n\nChoices:  \n{body}"


def _flight_plan(rng: np.random.Generator, seconds: float, clips: int, balanced: bool = False) -> list[Segment]:
    shortest = max(2.0, 0.4 * seconds)
    base = ["fly forward", "turn left", "turn right", "rise", "descend", "fly backward"]
    order: list[str] = []
    segs: list[Segment] = []
    t = 0.0
    while t < seconds + 2.5 or sum(1 for s in segs[:-1] if s.end >= shortest) < clips:
        if not order:
            order = [base[i] for i in rng.permutation(len(base))]
            if not segs and not {"turn left", "turn right"} & set(order[:2]):
                turn = next(i for i, a in enumerate(order) if a.startswith("turn"))
                order[1], order[turn] = order[turn], order[1]
            if segs and order[0] == segs[-1].action:
                order.append(order.pop(0))
        action = order.pop(0)
        duration = float(rng.choice([1.0, 1.5, 2.0, 2.5]))
        if action.startswith("turn"):
            rate = float(rng.uniform(12, 25) if rng.random() < 0.5 else rng.uniform(60, 100))
            if balanced and rate > 45:
                # Fast turns of either less or more than half a circle, well clear of it, so
                # that the way back round is as often shorter as longer (Counterfactual).
                angle = float(rng.uniform(40, 135) if rng.random() < 0.5 else rng.uniform(225, 320))
                rate = angle / duration
        elif action in ("rise", "descend"):
            rate = float(rng.uniform(3, 5))
        else:
            rate = float(rng.uniform(1.12, 1.25) if action == "fly forward" else rng.uniform(1.08, 1.15))
        segs.append(Segment(action, t, duration, rate))
        t += duration
    return segs


def _clip_ends(segs: list[Segment], seconds: float, clips: int) -> list[int]:
    """Indices of the segments each clip ends with; clips end on segment boundaries."""
    cands = [i for i, s in enumerate(segs[:-1]) if s.end >= max(2.0, 0.4 * seconds)]
    within = [i for i in cands if segs[i].end <= seconds + 1e-9] or cands[:1]
    last = cands.index(within[-1])
    pool = cands[: last + 1] if last + 1 >= clips else cands[:clips]
    picks = np.linspace(0, len(pool) - 1, clips).round().astype(int)
    return [pool[i] for i in picks]


def _step_phrases(segs: list[Segment], landmark: dict[int, Thing]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for i, s in enumerate(segs):
        k = seen.get(s.action, 0)
        seen[s.action] = k + 1
        text = AG_OPTION[s.action][2:-1]
        if i in landmark:
            text += f" toward the {landmark[i].name}"
        elif s.action.startswith("turn"):
            text += " quickly" if s.rate > 45 else " slowly"
        text += ["", " again", " a third time", " a fourth time"][min(k, 3)]
        out.append(f"I {text}.")
    return out


# Balanced flights place a landmark this far to the left or right of where its turn ends (or
# dead ahead): in the outer third of the frame at any zoom the flights reach.
LANDMARK_OFFSETS = (-16.0, 0.0, 16.0)


def place_urban_things(rng: np.random.Generator, segs: list[Segment],
                       balanced: bool = False) -> tuple[list[Thing], dict[int, Thing]]:
    """Objects of a flight: one at the end of each turn (a landmark, by segment index) while
    there is room, then others around the horizon; none closer than 22 degrees in azimuth.
    Balanced, a landmark stands left, ahead or right of the turn's end heading."""
    names = [URBAN_THINGS[i] for i in rng.permutation(len(URBAN_THINGS))]
    things: list[Thing] = []
    landmark: dict[int, Thing] = {}

    def free(az: float) -> bool:
        return all(abs(wrap180(az - o.azimuth)) >= 22 for o in things)

    for i, s in enumerate(segs):
        end = pose_at(segs, s.end)
        az = end.yaw
        if balanced:
            az = (az + LANDMARK_OFFSETS[int(rng.integers(3))] + float(rng.uniform(-2, 2))) % 360
        if s.action.startswith("turn") and free(az) and len(things) < 5:
            colour, shape = names[len(things)]
            thing = Thing(f"{colour} {shape}", colour, shape, az,
                          end.pitch + float(rng.uniform(-3, 3)), float(rng.uniform(8, 12)))
            things.append(thing)
            landmark[i] = thing
    for _ in range(200):
        if len(things) >= 6:
            break
        az = float(rng.uniform(0, 360))
        if free(az):
            colour, shape = names[len(things)]
            things.append(Thing(f"{colour} {shape}", colour, shape, az,
                                float(rng.uniform(-8, 8)), float(rng.uniform(7, 11))))
    return things, landmark


SIDE_PHRASE = {"left": "on my left", "ahead": "ahead of me", "right": "on my right"}
SIDE_MOVE = {"left": "I turn left.", "ahead": "I fly forward.", "right": "I turn right."}


def _urban_scene(rng: np.random.Generator, cfg: "SyntheticConfig", prefix: str, clips: int,
                 root: Path, qid: int, truth: list[dict], facts: list[dict], balance: Balancer | None,
                 crew: Crew) -> list[dict]:
    segs = _flight_plan(rng, cfg.seconds, clips, cfg.balanced)
    pose = lambda t: pose_at(segs, t)  # noqa: E731
    things, landmark = place_urban_things(rng, segs, cfg.balanced)
    target = landmark[max(landmark)] if landmark else things[0]
    ends = _clip_ends(segs, cfg.seconds, clips)
    vids = [f"{prefix}.mp4"] if clips == 1 else [f"{prefix}_{k}.mp4" for k in range(clips)]
    n_frames = [max(2, round(segs[e].end * cfg.fps)) for e in ends]
    clips_out = tuple((root / "videos" / v, n) for v, n in zip(vids, n_frames))
    crew.submit(Shot(backdrop(rng, cfg.width, indoor=False), tuple(things), tuple(segs), Pose(0.0, 0.0, 1.0),
                     clips_out, cfg.fps, cfg.width, cfg.height))
    seen_at, glimpsed_at = visibility(things, pose, max(n_frames), cfg.fps, cfg.height / cfg.width)
    steps = _step_phrases(segs, landmark)
    rows: list[dict] = []
    for vid, end, n in zip(vids, ends, n_frames):
        frames = video_truth(vid, things, segs, pose, n, cfg.fps, cfg.height / cfg.width)
        truth += frames
        last = {name: side(x) for name, x in zip(frames[-1]["objects"], frames[-1]["x"])}
        seen = [t.name for t, f in zip(things, seen_at) if f is not None and f < n]
        glimpsed_names = {t.name for t, f in zip(things, glimpsed_at) if f is not None and f < n}
        for cat, question, opts, answer, header, (kind, about) in _urban_questions(
                rng, cfg, segs, end, things, seen, glimpsed_names, landmark, target, steps, last, balance):
            facts.append(fact(qid + len(rows), kind, about))
            rows.append({"Question_id": qid + len(rows), "video_id": vid, "question_category": cat,
                         "question": _mcq(question, opts, header), "answer": answer})
    return rows


def _urban_questions(rng: np.random.Generator, cfg: "SyntheticConfig", segs: list[Segment], end: int,
                     things: list[Thing], seen: list[str], glimpsed_names: set[str],
                     landmark: dict[int, Thing], target: Thing, steps: list[str], last: dict[str, str],
                     balance: Balancer | None = None) -> Iterator[tuple]:
    """Yield (category, question, options, answer letter, header, (fact kind, objects)) for
    the clip ending with segment ``end``. ``last``: the objects in view in the clip's last
    frame, each with its third of the frame (``truth.side``), which is where the agent sees it
    now. With a ``balance``, each question's subject is the one whose answer has been right
    least often so far."""
    k = cfg.questions_per_category
    order = cfg.option_order
    # The goals of the questions about the end of the clip are things in view there, so what
    # the last frame shows answers them: the target first when it is in view.
    goals = sorted(last, key=lambda n: (n != target.name, n))
    goals = [goals[0]] + [goals[1:][i] for i in rng.permutation(len(goals) - 1)] if goals else []
    yield from _goal_questions(rng, order, k, goals, last, balance)
    yield _progress_question(rng, order, segs, end, steps)
    yield from _counterfactual_questions(rng, order, k, segs, end, landmark, balance)
    yield from _recall_questions(rng, order, k, seen, glimpsed_names)
    yield from _duration_questions(rng, order, k, segs[: end + 1])


def _chosen(rng: np.random.Generator, balance: Balancer | None, task: str, n: int, goals: list[str],
            last: dict[str, str]) -> list[str]:
    if balance is None:
        return goals[:n]
    left, out = list(goals), []
    while left and len(out) < n:
        out.append(balance.pick(task, [(last[g], g) for g in left], rng, ("left", "ahead", "right")))
        left.remove(out[-1])
    return out


def _goal_questions(rng: np.random.Generator, order: str, k: int, goals: list[str], last: dict[str, str],
                    balance: Balancer | None) -> Iterator[tuple]:
    # Action Generation: the next move heads for the goal: turn toward it, or fly on when ahead.
    for name in _chosen(rng, balance, "Action Generation", 1, goals, last):
        nxt = SIDE_MOVE[last[name]]
        others = [o for o in AG_OPTION.values() if o != nxt] + AG_DISTRACTORS
        opts, ans = options(rng, nxt, [others[i] for i in rng.permutation(len(others))[:6]], order, AG_FIXED)
        yield ("Action Generation", f"At the initial position, you are asked to navigate to the {name}. "
               "What is your next move, given the target location for your next move?", opts, ans, "choose",
               ("place_now", [name]))
    # Landmark Position: where a landmark is at the end of the clip.
    for name in _chosen(rng, balance, "Landmark Position", k, goals, last):
        where = SIDE_PHRASE[last[name]]
        opts, ans = options(rng, f"The {name} is {where}.",
                            [f"The {name} is {s}." for s in LP_PLACES if s != where], order,
                            [f"The {name} is {s}." for s in LP_PLACES])
        yield ("Landmark Position", f"At the initial position, you are asked to navigate to the "
               f"{name}. When you reach the current location, what is the direction to the "
               "destination?", opts, ans, "choose", ("place_now", [name]))


def _progress_question(rng: np.random.Generator, order: str, segs: list[Segment], end: int,
                       steps: list[str]) -> tuple:
    """Which instruction step the last frames belong to; the other options are steps of other
    movements, so the last movement seen tells them apart."""
    instruction = " ".join(s[2].lower() + s[3:] for s in steps)
    wrong = [steps[i] for i in rng.permutation(len(steps)) if segs[i].action != segs[end].action][:4]
    # Fixed: one option per movement, in one order: the step under way for its own movement,
    # a step of the instruction (or the bare movement) for each other.
    per_move = None
    if order == "fixed":
        per_move = {a: next((steps[i] for i in rng.permutation(len(steps)) if segs[i].action == a), AG_OPTION[a])
                    for a in AG_OPTION}
        per_move[segs[end].action] = steps[end]
    opts, ans = options(rng, steps[end], wrong, order, list(per_move.values()) if per_move else None)
    return ("Progress Evaluation", f"Navigation Instruction given at initial position: [{instruction}]. "
            "You move according to a series of movement instructions. What are you doing now?",
            opts, ans, "choose", ("last_action", []))


def _counterfactual_questions(rng: np.random.Generator, order: str, k: int, segs: list[Segment], end: int,
                              landmark: dict[int, Thing], balance: Balancer | None) -> Iterator[tuple]:
    # Turning the other way also reaches the landmark; longer or shorter?
    turns = [i for i in range(end + 1) if i in landmark and abs(segs[i].rate * segs[i].duration - 180) > 15]
    if balance is not None:
        ranked: list[int] = []
        outcome = lambda i: "shorter" if segs[i].rate * segs[i].duration > 180 else "longer"  # noqa: E731
        while turns and len(ranked) < k:
            pick = balance.pick("Counterfactual", [(outcome(i), i) for i in turns], rng, ("longer", "shorter"), slack=2)
            if pick is None:
                break
            ranked.append(pick)
            turns.remove(pick)
        turns = ranked
    for i in turns[:k]:
        s, lm = segs[i], landmark[i].name
        d, other = s.action.split()[1], "right" if s.action == "turn left" else "left"
        angle = s.rate * s.duration
        pre = f"If I turn {other} instead, I"
        longer = f"{pre} can still face the {lm}, but the alternative turn takes longer."
        shorter = f"{pre} can still face the {lm}, and the alternative turn is shorter."
        never = f"{pre} cannot face the {lm}, because it stays out of my view."
        correct = longer if 360 - angle > angle else shorter
        opts, ans = options(rng, correct, [o for o in (longer, shorter, never) if o != correct], order,
                            [longer, shorter, never])
        yield ("Counterfactual", f"Instead of turning {d} toward the {lm}, if you choose to turn "
               f"{other}, can you still face the {lm}, and how is the alternative route?",
               opts, ans, "choices", ("turn_to", [lm]))


def _recall_questions(rng: np.random.Generator, order: str, k: int, seen: list[str],
                      glimpsed_names: set[str]) -> Iterator[tuple]:
    # Clearly seen (centre in view) against never glimpsed; half-seen ones are no option.
    unseen = [f"{c} {s}" for c, s in URBAN_THINGS if f"{c} {s}" not in glimpsed_names]
    for name in [seen[i] for i in rng.permutation(len(seen))][:k]:
        art = lambda n: ("An " if n[0] in "aeiou" else "A ") + n + "."  # noqa: E731
        opts, ans = options(rng, art(name), [art(unseen[i]) for i in rng.permutation(len(unseen))[:4]], order)
        yield ("Object Recall", "Which of the following objects do you see during the flight?",
               opts, ans, "choices", ("first_seen", [name]))


def _duration_questions(rng: np.random.Generator, order: str, k: int, done: list[Segment]) -> Iterator[tuple]:
    # Two movements that occur once each in the clip.
    counts: dict[str, int] = {}
    for s in done:
        counts[s.action] = counts.get(s.action, 0) + 1
    single = [s for s in done if counts[s.action] == 1]
    pairs = list(itertools.combinations(single, 2))
    for j in rng.permutation(len(pairs))[:k].tolist():
        a, b = pairs[j]
        na, nb = ACTION_NOUN[a.action], ACTION_NOUN[b.action]
        first_longer = f"My {na} takes longer than my {nb}."
        second_longer = f"My {nb} takes longer than my {na}."
        same = f"My {na} takes the same time as my {nb}."
        correct = same if a.duration == b.duration else first_longer if a.duration > b.duration else second_longer
        opts, ans = options(rng, correct, [o for o in (first_longer, second_longer, same) if o != correct], order)
        yield ("Duration", f"Which takes longer, your {na} or your {nb}?", opts, ans, "choices",
               ("actions", []))


def write_urban_bench(root: Path, cfg: "SyntheticConfig", crew: Crew | None = None) -> dict:
    """Write ``root/UrbanVideo-Bench`` (``videos/`` and ``MCQ.parquet``) as the hub repo lays it out;
    ``crew`` films the videos (default: here, one after another)."""
    with Crew(1) if crew is None else contextlib.nullcontext(crew) as crew:
        return _write_urban_bench(root, cfg, crew)


def _write_urban_bench(root: Path, cfg: "SyntheticConfig", crew: Crew) -> dict:
    top = np.random.default_rng([cfg.seed, 7])
    folder = root / urbanvideo.BENCHMARK.folder
    rows: list[dict] = []
    truth: list[dict] = []
    facts: list[dict] = []
    balance = Balancer() if cfg.balanced else None
    families = ["EmbodiedCity", "AerialVLN", "RealWorld"]
    numbers = (1 + top.permutation(120)).tolist()
    left, scene = cfg.urban_videos, 0
    while left > 0:
        clips = min(cfg.clips_per_scene, left)
        family = families[scene % 3]
        prefix = f"{family}_{numbers[scene % 120]}"
        if family == "AerialVLN":
            prefix += "_" + "".join(top.choice(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"), 30))
        rng = np.random.default_rng([cfg.seed, 1, scene])
        rows += _urban_scene(rng, cfg, prefix, clips, folder, len(rows), truth, facts, balance, crew)
        left -= clips
        scene += 1
    write_truth(truth, folder)
    write_facts(facts, folder)
    write_parquet_atomic(table_from_records(rows, arrow_schema(urbanvideo.COLUMNS)), folder / urbanvideo.FILE)
    return {"urban_videos": cfg.urban_videos, "urban_scenes": scene, "urban_questions": len(rows)}
