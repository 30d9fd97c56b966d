"""VSI-Bench-style room scans, one video per scene: furniture at known floor positions around a
camera that turns about once on the spot, with short flights and tilts between; distances,
directions, routes and the order in which objects first show from the layout and visibility."""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import shutil
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from embodied_r.benchmarks import vsibench
from embodied_r.benchmarks.base import arrow_schema
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.synthetic.config import SyntheticConfig
from embodied_r.synthetic.filming import Crew, Shot
from embodied_r.synthetic.truth import fact, video_truth, write_facts, write_truth
from embodied_r.synthetic.world import (EXTENT, LETTERS, Balancer, Pose, Segment, Thing, backdrop, options, pose_at,
                                         segments_from, visibility, wrap180)


# VSI-style categories: (name, colour, shape, typical longest dimension in cm)
VSI_THINGS = [("chair", "red", "cube", (75, 100)), ("table", "pink", "box", (120, 180)),
              ("sofa", "blue", "box", (180, 240)), ("tv", "black", "panel", (90, 140)),
              ("bed", "white", "box", (190, 210)), ("lamp", "yellow", "cone", (40, 160)),
              ("plant", "green", "sphere", (40, 120)), ("door", "orange", "panel", (200, 210)),
              ("cabinet", "purple", "cube", (80, 200)), ("toilet", "cyan", "cylinder", (65, 75))]


def _room(rng: np.random.Generator) -> tuple[float, float, tuple[float, float], list[Thing]]:
    length, width = round(float(rng.uniform(4, 8)), 1), round(float(rng.uniform(3, 6)), 1)
    cam = (length / 2 + float(rng.uniform(-0.4, 0.4)), width / 2 + float(rng.uniform(-0.4, 0.4)))
    pool = [VSI_THINGS[0]] * int(rng.integers(2, 5)) + [VSI_THINGS[i] for i in 1 + rng.permutation(9)[:6]]
    things: list[Thing] = []
    for name, colour, shape, (lo, hi) in pool:
        for _ in range(300):
            x, y = float(rng.uniform(0.3, length - 0.3)), float(rng.uniform(0.3, width - 0.3))
            d = math.hypot(x - cam[0], y - cam[1])
            az = math.degrees(math.atan2(x - cam[0], y - cam[1])) % 360
            size = min(13.0, max(6.0, 16.0 / d))
            # Apart on the panorama too, so no object hides another.
            if d >= 1.0 and all(math.hypot(x - o.x, y - o.y) >= 0.7 and abs(wrap180(az - o.azimuth))
                                >= EXTENT[shape][0] * size + EXTENT[o.shape][0] * o.size + 2 for o in things):
                things.append(Thing(name, colour, shape, az, float(rng.uniform(-9, 4)), size, x, y,
                                    int(rng.integers(lo, hi + 1))))
                break
    return length, width, cam, things


def _room_scan(rng: np.random.Generator, seconds: float) -> list[Segment]:
    """A full turn (about 380 degrees) at uneven speeds, broken by short flights and tilts."""
    others = [("fly forward", 1.2), ("fly backward", 1.15), ("rise", 4.0), ("descend", 4.0), ("hover", 0.0)]
    breaks = [others[i] for i in rng.permutation(len(others))[:3]]
    still = [round(float(rng.uniform(0.08, 0.12)) * seconds, 1) for _ in breaks]
    turn_time = seconds - sum(still)
    shares = rng.dirichlet(np.ones(4)) * 0.6 + 0.1
    durations = shares / shares.sum() * turn_time
    weights = durations * rng.uniform(0.4, 2.0, 4)
    angles = weights / weights.sum() * 380.0
    action = "turn right" if rng.random() < 0.5 else "turn left"
    motions: list[tuple[str, float, float]] = []
    for i in range(4):
        motions.append((action, float(durations[i]), float(angles[i] / durations[i])))
        if i < 3:
            motions.append((breaks[i][0], still[i], breaks[i][1]))
    return segments_from(motions)


def _turn_class(rel: float) -> str:
    return "Turn Back" if abs(rel) > 135 else "Turn Right" if rel > 0 else "Turn Left"


# Under option_order "fixed", the closed sets of the direction questions in their one order.
DIRECTION_SETS = {"object_rel_direction_easy": ["left", "right"],
                  "object_rel_direction_medium": ["left", "right", "back"],
                  "object_rel_direction_hard": ["front-left", "front-right", "back-left", "back-right"]}


def _dist(a: Thing, b: Thing) -> float:
    return math.hypot(a.x - b.x, a.y - b.y)


def _bearing(a: Thing, b: Thing) -> float:
    return math.degrees(math.atan2(b.x - a.x, b.y - a.y))


def _rel(a: Thing, b: Thing, c: Thing) -> float:
    return wrap180(_bearing(a, c) - _bearing(a, b))


def _lettered(opts: list[str]) -> list[str]:
    return [f"{LETTERS[i]}. {o}" for i, o in enumerate(opts)]


def _vsi_questions(rng: np.random.Generator, cfg: "SyntheticConfig", dims: tuple[float, float],
                   things: list[Thing], seen_at: list[int | None], balance: Balancer | None = None
                   ) -> Iterator[tuple]:
    """Yield (question_type, question, options or None, ground_truth, (fact kind, objects))."""
    k = cfg.questions_per_category
    single = [t for t in things if sum(o.name == t.name for o in things) == 1]
    yield from _counting_questions(rng, things, k)
    # Random draws of four distinct single-instance objects; questions keep the clear-cut ones.
    trios = [tuple(single[i] for i in rng.permutation(len(single))[:4]) for _ in range(40)] if len(single) >= 4 else []
    yield from _measure_questions(trios[:k], dims)
    yield from _relation_questions(rng, cfg, trios, single, balance)
    yield from _appearance_questions(rng, cfg, things, single, seen_at)


def _counting_questions(rng: np.random.Generator, things: list[Thing], k: int) -> Iterator[tuple]:
    # The repeated category first, so counting is not always "1".
    names = sorted({t.name for t in things}, key=lambda n: (-sum(t.name == n for t in things), n))
    for name in names[:1] + [names[1:][i] for i in rng.permutation(len(names) - 1)][: k - 1]:
        yield ("object_counting", f"How many {name}(s) are in this room?", None,
               str(sum(t.name == name for t in things)), ("first_seen", [name]))


def _measure_questions(trios: list[tuple], dims: tuple[float, float]) -> Iterator[tuple]:
    length, width = dims
    for a, b, *_ in trios:
        yield ("object_abs_distance", "Measuring from the closest point of each object, what is the "
               f"direct distance between the {a.name} and the {b.name} (in meters)?", None, f"{_dist(a, b):.1f}",
               ("positions", [a.name, b.name]))
    for a, *_ in trios:
        yield ("object_size_estimation", "What is the length of the longest dimension (length, width, "
               f"or height) of the {a.name}, measured in centimeters?", None, str(a.size_cm), ("positions", [a.name]))
    yield ("room_size_estimation", "What is the size of this room (in square meters)? If multiple rooms "
           "are shown, estimate the size of the combined space.", None, f"{length * width:.1f}", ("positions", []))


def _relation_questions(rng: np.random.Generator, cfg: "SyntheticConfig", trios: list[tuple],
                        single: list[Thing], balance: Balancer | None) -> Iterator[tuple]:
    """With a ``balance``, chosen among all the room's candidates so that each answer is
    right about as often as the others."""
    k = cfg.questions_per_category
    kinds = ["object_rel_distance", *DIRECTION_SETS, "route_planning"]
    if balance is None:
        made = dict.fromkeys(kinds, 0)
        for trio in trios:
            for kind, _, build in _relations(rng, cfg, single, *trio):
                if made[kind] < k:
                    made[kind] += 1
                    question, opts, ans, about = build()
                    yield kind, question, opts, ans, ("positions", about)
        return
    found: dict[str, list[tuple[str, Callable[[], tuple]]]] = {kind: [] for kind in kinds}
    for trio in trios:
        for kind, answer, build in _relations(rng, cfg, single, *trio):
            found[kind].append((answer, build))
    for kind in kinds:
        for _ in range(min(k, len(found[kind]))):
            build = balance.pick(kind, found[kind], rng, DIRECTION_SETS.get(kind, ()))
            found[kind] = [f for f in found[kind] if f[1] is not build]
            question, opts, ans, about = build()
            yield kind, question, opts, ans, ("positions", about)


def _relations(rng: np.random.Generator, cfg: "SyntheticConfig", single: list[Thing],
               a: Thing, b: Thing, c: Thing, d: Thing) -> Iterator[tuple]:
    """The relation questions a trio can ask: (type, answer, builder); the builder draws its
    options only when the question is asked."""
    cands = [b, c, d] + [t for t in single if t not in (a, b, c, d)][:1]
    if cfg.option_order == "sorted":
        cands = sorted(cands, key=lambda t: t.name)
    ds = sorted(_dist(a, t) for t in cands)
    if len(cands) == 4 and ds[1] - ds[0] >= 0.3:
        best = min(cands, key=lambda t: _dist(a, t))
        yield ("object_rel_distance", best.name, lambda: (
            "Measuring from the closest point of each object, which of these "
            f"objects ({', '.join(t.name for t in cands)}) is the closest to the {a.name}?",
            _lettered([t.name for t in cands]), LETTERS[cands.index(best)], [a.name] + [t.name for t in cands]))
    r = _rel(a, b, c)
    stand = f"If I am standing by the {a.name} and facing the {b.name}, "
    where = [a.name, b.name, c.name]

    def direction(kind: str, answer: str, question: str) -> tuple:
        others = [o for o in DIRECTION_SETS[kind] if o != answer]
        return kind, answer, lambda: (question, *_lettered_answer(rng, answer, others, cfg.option_order,
                                                                  DIRECTION_SETS[kind]), where)

    if 20 <= abs(r) <= 160:
        yield direction("object_rel_direction_easy", "right" if r > 0 else "left",
                        stand + f"is the {c.name} to the left or the right of the {b.name}?")
    if 20 <= abs(r) and abs(abs(r) - 135) >= 10:
        yield direction("object_rel_direction_medium", "back" if abs(r) > 135 else "right" if r > 0 else "left",
                        stand + f"is the {c.name} to my left, right, or back? An object is to my back if I "
                        "would have to turn at least 135 degrees in order to face it.")
    if min(abs(r), 180 - abs(r), abs(abs(r) - 90)) >= 10:
        yield direction("object_rel_direction_hard",
                        ("front" if abs(r) < 90 else "back") + ("-right" if r > 0 else "-left"),
                        stand + f"is the {c.name} to my front-left, front-right, back-left, or back-right? The "
                        "directions refer to the quadrants of a Cartesian plane (if I am standing at the origin "
                        "and facing along the positive y-axis).")
    r1, r2 = _rel(a, b, c), wrap180(_bearing(c, d) - _bearing(a, c))
    clear = lambda x: 35 <= abs(x) <= 125 or abs(x) >= 150  # noqa: E731
    if clear(r1) and clear(r2):
        right = f"{_turn_class(r1)}, {_turn_class(r2)}"

        def route() -> tuple:
            combos = [f"{p}, {q}" for p in ("Turn Left", "Turn Right", "Turn Back")
                      for q in ("Turn Left", "Turn Right", "Turn Back") if f"{p}, {q}" != right]
            opts, ans = options(rng, right, [combos[i] for i in rng.permutation(len(combos))[:3]],
                                cfg.option_order)
            return (f"You are a robot beginning at the {a.name} facing the {b.name}. You want to navigate "
                    f"to the {d.name}. You will perform the following actions (Note: for each [please fill "
                    "in], choose either 'turn back,' 'turn left,' or 'turn right.'): 1. [please fill in]. "
                    f"2. Go forward until the {c.name}. 3. [please fill in]. 4. Go forward until the "
                    f"{d.name}. You have reached the final destination.", _lettered(opts), ans,
                    [a.name, b.name, c.name, d.name])
        yield "route_planning", right, route


def _appearance_questions(rng: np.random.Generator, cfg: "SyntheticConfig", things: list[Thing],
                          single: list[Thing], seen_at: list[int | None]) -> Iterator[tuple]:
    # When each first shows in full view (its centre in the frame, what a perceiver names),
    # for objects that show at clearly different moments.
    order = sorted((f, t.name) for t, f in zip(things, seen_at) if t in single and f is not None)
    spaced = [order[0]] if order else []
    for f, name in order[1:]:
        if f - spaced[-1][0] >= 0.8 * cfg.fps:
            spaced.append((f, name))
    for _ in range(cfg.questions_per_category if len(spaced) >= 4 else 0):
        pick = sorted(spaced[i] for i in rng.permutation(len(spaced))[:4])
        right = [n for _, n in pick]
        perms = [list(p) for p in itertools.permutations(right) if list(p) != right]
        wrong = [", ".join(perms[i]) for i in rng.permutation(len(perms))[:3]]
        opts, ans = options(rng, ", ".join(right), wrong, cfg.option_order)
        listed = [right[i] for i in rng.permutation(4)]
        yield ("obj_appearance_order", "What will be the first-time appearance order of the following "
               f"categories in the video: {', '.join(listed)}?", _lettered(opts), ans, ("first_seen", listed))


def _lettered_answer(rng: np.random.Generator, answer: str, others: list[str], order: str,
                     closed: list[str]) -> tuple[list[str], str]:
    opts, ans = options(rng, answer, others, order, closed)
    return _lettered(opts), ans


def _scene_name(rng: np.random.Generator, dataset: str) -> str:
    if dataset == "arkitscenes":
        return str(41000000 + int(rng.integers(0, 999999)))
    if dataset == "scannet":
        return f"scene{int(rng.integers(0, 800)):04d}_{int(rng.integers(0, 3)):02d}"
    return "".join(rng.choice(list("0123456789abcdef"), 10))


def _zip_add(zf: zipfile.ZipFile, path: Path, arcname: str) -> None:
    """Add a file with a fixed date, so the same seed gives byte-identical archives."""
    info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    with open(path, "rb") as src, zf.open(info, "w") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)


def _zip_and_remove(zf: zipfile.ZipFile, path: Path, arcname: str) -> None:
    _zip_add(zf, path, arcname)
    path.unlink()


def write_vsi_bench(root: Path, cfg: "SyntheticConfig", crew: Crew | None = None) -> dict:
    """Write ``root/VSI-Bench``: the three video zips and the questions Parquet, as on the hub;
    ``crew`` films the videos (default: here, one after another)."""
    with Crew(1) if crew is None else contextlib.nullcontext(crew) as crew:
        return _write_vsi_bench(root, cfg, crew)


def _write_vsi_bench(root: Path, cfg: "SyntheticConfig", crew: Crew) -> dict:
    rows: list[dict] = []
    facts: list[dict] = []
    balance = Balancer() if cfg.balanced else None
    world: list[dict] = []  # per-frame truth rows
    vsi = root / vsibench.BENCHMARK.folder
    tmp = vsi / ".render"
    vsi.mkdir(parents=True, exist_ok=True)
    zips = {d: zipfile.ZipFile(vsi / f"{d}.zip.tmp", "w", zipfile.ZIP_STORED) for d in vsibench.DATASETS}
    used: set[str] = set()
    try:
        for i in range(cfg.vsi_scenes):
            rng = np.random.default_rng([cfg.seed, 2, i])
            dataset = vsibench.DATASETS[i % 3]
            name = _scene_name(rng, dataset)
            while name in used:
                name = _scene_name(rng, dataset)
            used.add(name)
            length, width, cam, things = _room(rng)
            segs = _room_scan(rng, cfg.seconds)
            start_pose = Pose(float(rng.uniform(0, 360)), 0.0, 1.0)
            drawn = backdrop(rng, cfg.width, indoor=True)
            video = tmp / f"{dataset}_{name}.mp4"
            pose_fn = lambda t: pose_at(segs, t, start_pose)  # noqa: E731
            n_frames = round(cfg.seconds * cfg.fps)
            # Into its zip once filmed, in the scenes' order, as the hub's archives list them.
            crew.submit(Shot(drawn, tuple(things), tuple(segs), start_pose, ((video, n_frames),), cfg.fps,
                             cfg.width, cfg.height),
                        then=functools.partial(_zip_and_remove, zips[dataset], video, f"{dataset}/{name}.mp4"))
            seen_at, _ = visibility(things, pose_fn, n_frames, cfg.fps, cfg.height / cfg.width)
            world += video_truth(f"{dataset}/{name}", things, segs, pose_fn, n_frames, cfg.fps,
                                 cfg.height / cfg.width, camera=cam)
            for qtype, question, opts, truth, (kind, about) in _vsi_questions(
                    rng, cfg, (length, width), things, seen_at, balance):
                facts.append(fact(len(rows), kind, about))
                rows.append({"id": len(rows), "dataset": dataset, "scene_name": name,
                             "question_type": qtype, "question": question, "options": opts,
                             "ground_truth": truth})
        crew.wait()
    finally:
        crew.abandon()  # after an error, no worker still writes into the folder cleaned below
        for z in zips.values():
            z.close()
        if tmp.exists():
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    for d in vsibench.DATASETS:
        os.replace(vsi / f"{d}.zip.tmp", vsi / f"{d}.zip")
    write_truth(world, vsi)
    write_facts(facts, vsi)
    write_parquet_atomic(table_from_records(rows, arrow_schema(vsibench.COLUMNS)), vsi / vsibench.FILE)
    return {"vsi_scenes": cfg.vsi_scenes, "vsi_questions": len(rows)}
