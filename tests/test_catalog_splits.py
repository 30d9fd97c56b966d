"""Scene-disjoint splits weighted by questions, the last scene kept for testing, the seeded
cap per task, and the split counts the flow logs."""

from __future__ import annotations

import hashlib

import pytest

from embodied_r.data.catalog import SplitConfig, _cap, assign_splits, metric_counts, metric_name, split_counts


def scenes_split(counts: dict[str, int], cfg: SplitConfig) -> dict[str, str]:
    rows = [{"benchmark": "b", "scene": s, "uid": f"{s}:{i}"} for s, n in counts.items() for i in range(n)]
    assign_splits(rows, cfg)
    out: dict[str, str] = {}
    for r in rows:
        assert out.setdefault(r["scene"], r["split"]) == r["split"]  # a scene is never divided
    return out


def test_scenes_fill_the_splits_by_their_questions() -> None:
    # Seed 0 orders these scenes s0, s5, s2, s4, s1, s3. s0 alone holds 70 of the 100
    # questions: s5 takes train to 75, s2 fills val; counted by scenes, five would be train.
    counts = {"s0": 70, "s1": 5, "s2": 5, "s3": 10, "s4": 5, "s5": 5}
    assert scenes_split(counts, SplitConfig(seed=0)) == {
        "s0": "train", "s5": "train", "s2": "val", "s4": "test", "s1": "test", "s3": "test"}


def test_the_last_scene_is_never_trained_on_unless_it_is_the_only_one() -> None:
    # Seed 0 orders s0, s2, s1: by the fractions all three would be train.
    cfg = SplitConfig(train=0.9, val=0.0, test=0.1, seed=0)
    assert scenes_split({"s0": 1, "s1": 1, "s2": 1}, cfg) == {"s0": "train", "s2": "train", "s1": "test"}
    assert scenes_split({"s0": 1, "s1": 1}, cfg) == {"s0": "train", "s1": "test"}
    assert scenes_split({"s0": 1}, cfg) == {"s0": "train"}
    # Without a test share nothing is moved to test.
    assert scenes_split({"s0": 1, "s1": 1}, SplitConfig(train=1.0, val=0.0, test=0.0)) == {
        "s0": "train", "s1": "train"}


def rank(seed: int, uid: str) -> str:
    return hashlib.sha256(f"{seed}\0{uid}".encode()).hexdigest()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_cap_keeps_the_seeded_first_questions_of_each_task(seed: int) -> None:
    rows = [{"uid": f"{b}:{c}{i}", "benchmark": b, "category": c}
            for b in ("u", "v") for c in ("x", "y") for i in range(6)]
    kept = _cap(rows, 2, seed)
    expected = []
    for b in ("u", "v"):
        for c in ("x", "y"):
            group = [r for r in rows if (r["benchmark"], r["category"]) == (b, c)]
            expected += sorted(group, key=lambda r: rank(seed, r["uid"]))[:2]
    assert kept == sorted(expected, key=lambda r: (r["benchmark"], r["uid"]))
    assert _cap(rows, None, seed) is rows


def test_the_cap_depends_on_the_seed() -> None:
    rows = [{"uid": f"u:{i}", "benchmark": "u", "category": "x"} for i in range(20)]
    picks = {tuple(r["uid"] for r in _cap(rows, 3, seed)) for seed in range(4)}
    assert len(picks) > 1


def test_split_counts_per_benchmark_task_and_split() -> None:
    rows = [{"benchmark": "u", "category": "Start/End Position", "split": s} for s in ("train", "train", "test")]
    rows += [{"benchmark": "u", "category": "start end position", "split": "val"},
             {"benchmark": "v", "category": "route", "split": "test"}]
    assert split_counts(rows) == {
        "u": {"Start/End Position": {"train": 2, "val": 0, "test": 1},
              "start end position": {"train": 0, "val": 1, "test": 0}},
        "v": {"route": {"train": 0, "val": 0, "test": 1}},
    }
    # Two spellings of one task are one metric name: their counts add up.
    assert metric_counts(rows) == {
        "u": {"start_end_position": {"train": 2, "val": 1, "test": 1}},
        "v": {"route": {"train": 0, "val": 0, "test": 1}},
    }


def test_metric_names_have_no_leading_trailing_or_repeated_separators() -> None:
    assert metric_name("  Start/End Position  ") == "start_end_position"
    assert metric_name("_obj_appearance_order_") == "obj_appearance_order"
    assert metric_name("///") == "unnamed"
