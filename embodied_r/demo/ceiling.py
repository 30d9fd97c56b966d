"""The scripted reader that answers from the perception text alone (the ceiling), and the floors beside it."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from embodied_r.scoring.metrics import chance_accuracy

_LINE = re.compile(r"^Frame (\d+): (?:After (.+?), )?Observe: (.*)$")
_TURN = re.compile(r"I turned about (\d+) degrees")
_THING = re.compile(r"the ([a-z]+(?: [a-z]+)?) is (on my left|ahead of me|on my right)"
                    r"(?: \((\d+(?:\.\d+)?) m away, (\d+) degrees (left|right)\))?")
_VERB = {"rotate left": "turn left", "rotate right": "turn right", "move up": "rise", "move down": "descend",
         "move forward": "fly forward", "move backward": "fly backward"}
_MOVE = {"on my left": "I turn left.", "ahead of me": "I fly forward.", "on my right": "I turn right."}


def frames(video_text: str) -> list[dict[str, Any]]:
    """Per frame: its action, its turn in degrees (signed, right positive) and each mention
    (name, place, distance or None, bearing or None) in the order written."""
    out = []
    for line in video_text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        action, text = m.group(2) or "", m.group(3)
        turn = _TURN.search(text)
        degrees = float(turn.group(1)) if turn else 0.0
        sign = -1 if action == "rotate left" else 1 if action == "rotate right" else 0
        seen = [(t.group(1), t.group(2), float(t.group(3)) if t.group(3) else None,
                 (1 if t.group(5) == "right" else -1) * float(t.group(4)) if t.group(4) else None)
                for t in _THING.finditer(text)]
        out.append({"action": action, "turn": sign * degrees, "seen": seen})
    return out


def _pick(options: list[str], wanted: str) -> str | None:
    for o in options:
        if o[3:].strip().rstrip(".").lower() == wanted.strip().rstrip(".").lower():
            return o[0]
    return None


def _place_now(fs: list[dict[str, Any]], name: str) -> str | None:
    for n, place, _, _ in fs[-1]["seen"] if fs else []:
        if n == name:
            return place
    return None


def floor_plan(fs: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Each thing's place on the floor (metres, the scan's first heading up), from its first
    sighting with a distance and the turns added up before it."""
    heading, plan = 0.0, {}
    for f in fs:
        heading += f["turn"]
        for name, _, dist, bearing in f["seen"]:
            if dist is not None and name not in plan:
                az = math.radians(heading + bearing)
                plan[name] = (dist * math.sin(az), dist * math.cos(az))
    return plan


def _bearing(a: tuple[float, float], b: tuple[float, float]) -> float:
    return math.degrees(math.atan2(b[0] - a[0], b[1] - a[1]))


def _rel(x: float) -> float:
    return (x + 180.0) % 360.0 - 180.0


def _from_floor_plan(category: str, q: str, options: list[str],
                     plan: dict[str, tuple[float, float]]) -> str | None:
    """The option letter a floor plan supports for its three tasks, or None."""
    if category == "object_rel_distance":
        m = re.search(r"objects \(([^)]*)\) is the closest to the ([a-z]+)", q)
        if not m or m.group(2) not in plan:
            return None
        known = [o for o in options if o[3:].strip() in plan]
        if not known:
            return None
        a = plan[m.group(2)]
        return min(known, key=lambda o: math.dist(a, plan[o[3:].strip()]))[0]
    if category == "object_rel_direction":
        m = re.search(r"standing by the ([a-z]+) and facing the ([a-z]+), is the ([a-z]+)", q)
        if not m or any(n not in plan for n in m.groups()):
            return None
        a, b, c = (plan[n] for n in m.groups())
        r = _rel(_bearing(a, c) - _bearing(a, b))
        texts = [o[3:].strip() for o in options]
        if "front-left" in texts:
            want = ("front" if abs(r) < 90 else "back") + ("-right" if r > 0 else "-left")
        elif "back" in texts:
            want = "back" if abs(r) > 135 else "right" if r > 0 else "left"
        else:
            want = "right" if r > 0 else "left"
        return _pick(options, want)
    if category == "route_planning":
        m = re.search(r"beginning at the ([a-z]+) facing the ([a-z]+).*?navigate to the ([a-z]+).*?"
                      r"go forward until the ([a-z]+)", q)
        if not m:
            return None
        a, b, d, c = m.groups()
        if any(n not in plan for n in (a, b, c, d)):
            return None
        r1 = _rel(_bearing(plan[a], plan[c]) - _bearing(plan[a], plan[b]))
        r2 = _rel(_bearing(plan[c], plan[d]) - _bearing(plan[a], plan[c]))
        turn = lambda r: "Turn Back" if abs(r) > 135 else "Turn Right" if r > 0 else "Turn Left"  # noqa: E731
        return _pick(options, f"{turn(r1)}, {turn(r2)}")
    return None


def answer(category: str, question: str, options: list[str], video_text: str) -> str | None:
    """The option letter the text supports, or None where it does not decide."""
    fs = frames(video_text)
    q = question.lower()
    if category in ("Landmark Position", "Action Generation"):
        m = re.search(r"navigate to the ([a-z]+ [a-z]+)", q)
        place = _place_now(fs, m.group(1)) if m else None
        if place is None:
            return None
        return _pick(options, f"The {m.group(1)} is {place}" if category == "Landmark Position" else _MOVE[place])
    if category == "Progress Evaluation":
        verb = _VERB.get(fs[-1]["action"]) if fs else None
        hits = [o[0] for o in options if verb and o[3:].lower().startswith(f"i {verb}")]
        return hits[0] if len(hits) == 1 else None
    if category == "Counterfactual":
        m = re.search(r"instead of turning (left|right) toward the ([a-z]+ [a-z]+)", q)
        if not m:
            return None
        sign = -1 if m.group(1) == "left" else 1
        first = next((i for i, f in enumerate(fs) if any(n == m.group(2) for n, *_ in f["seen"])), None)
        if first is None:
            return None
        # The turn that brought it into view: the run of turns that way up to its first sighting.
        angle, i = 0.0, first
        while i > 0 and fs[i]["turn"] * sign > 0:
            angle += abs(fs[i]["turn"])
            i -= 1
        wanted = "and the alternative turn is shorter" if angle > 180 else "but the alternative turn takes longer"
        return next((o[0] for o in options if wanted in o), None)
    if category == "obj_appearance_order":
        firsts: dict[str, int] = {}
        for f in fs:
            for name, *_ in f["seen"]:
                firsts.setdefault(name, len(firsts))
        for o in options:
            listed = [n.strip() for n in o[3:].split(",")]
            if all(n in firsts for n in listed) and listed == sorted(listed, key=firsts.get):
                return o[0]
        return None
    return _from_floor_plan(category, q, options, floor_plan(fs))


def ceiling(catalog: Path, perception: Path, split: str = "test") -> dict[str, Any]:
    """The scripted reader's accuracy on ``split``, per task too, beside chance; an undecided question is wrong."""
    rows = _choice_rows(catalog)
    cat = [r for r in rows if r["split"] == split]
    texts = {r["uid"]: r["video_text"] for r in pq.read_table(Path(perception) / "perception.parquet").to_pylist()}
    by_task: dict[str, list[int]] = {}
    for r in cat:
        got = answer(r["category"], r["question"], list(r["options"]), texts.get(r["uid"], ""))
        by_task.setdefault(r["category"], []).append(int(got == r["answer"]))
    right = [x for xs in by_task.values() for x in xs]
    answers = _train_answers(rows)
    return {"split": split, "questions": len(right), "accuracy": sum(right) / len(right) if right else 0.0,
            "by_task": {k: sum(v) / len(v) for k, v in sorted(by_task.items())},
            "chance": chance_accuracy({**r, "answer_type": "choice"} for r in cat),
            "prior": _letter_prior(answers, cat), "answer_chance": _answer_chance(answers, cat)}


def _choice_rows(catalog: Path) -> list[dict[str, Any]]:
    return [r for r in pq.read_table(catalog).to_pylist() if r["answer_type"] == "choice"]


def _train_answers(rows: list[dict[str, Any]]) -> dict[str, Counter[str]]:
    """Per task, how often each answer is right in the train split."""
    counts: dict[str, Counter[str]] = {}
    for r in rows:
        if r["split"] == "train":
            counts.setdefault(r["category"], Counter())[r["answer"]] += 1
    return counts


def answer_chance(catalog: Path, split: str = "test") -> float:
    """A uniform guess among the answers each task's train questions have: where options include
    some the world never makes right, balanced answers hold the letter floor to this."""
    rows = _choice_rows(catalog)
    return _answer_chance(_train_answers(rows), [r for r in rows if r["split"] == split])


def _answer_chance(answers: dict[str, Counter[str]], tested: list[dict[str, Any]]) -> float:
    guesses = [1 / min(len(answers.get(r["category"], ())) or len(r["options"]), len(r["options"]))
               for r in tested]
    return sum(guesses) / len(guesses) if guesses else 0.0


def letter_prior(catalog: Path, split: str = "test") -> float:
    """The score of giving each task its commonest train letter: the floor a reasoner must rise above."""
    rows = _choice_rows(catalog)
    return _letter_prior(_train_answers(rows), [r for r in rows if r["split"] == split])


def _letter_prior(answers: dict[str, Counter[str]], tested: list[dict[str, Any]]) -> float:
    best = {task: max(c, key=c.get) for task, c in answers.items()}
    scored = [int(best.get(r["category"]) == r["answer"]) for r in tested]
    return sum(scored) / len(scored) if scored else 0.0
