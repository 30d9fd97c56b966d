"""Scene-disjoint splits weighted by questions, the last scene kept for testing, the seeded
cap per task, and the split counts the flow logs."""

from __future__ import annotations

import hashlib

import pytest

from embodied_r.data.catalog import _cap, assign_splits, metric_counts, metric_name, split_counts
from embodied_r.data.config import SplitConfig


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


def pooled_rows() -> list[dict]:
    """Twelve scenes over two benchmarks, one to four questions each."""
    return [{"benchmark": b, "scene": f"{b[0]}{s}", "uid": f"{b}{s}:{i}"}
            for b, n in (("urbanvideo", 7), ("vsibench", 5)) for s in range(n) for i in range(1 + (s * 3) % 4)]


def placed(rows: list[dict]) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for r in rows:
        assert out.setdefault(r["scene"], (r["split"], r["fold"])) == (r["split"], r["fold"])
    return out


def test_the_demo_split_is_unchanged() -> None:
    # The demo's split settings on a fixed set of scenes, as they were before the pooled rule.
    from embodied_r.config import load_recipe

    cfg = load_recipe("demo").catalog.split
    assert cfg.rule == "per_benchmark"
    rows = pooled_rows()
    assign_splits(rows, cfg)
    assert placed(rows) == {
        "u0": ("val", 1), "u1": ("test", 0), "u2": ("train", 0), "u3": ("val", 1), "u4": ("val", 0),
        "u5": ("train", 1), "u6": ("train", 0), "v0": ("train", 1), "v1": ("train", 0), "v2": ("val", 1),
        "v3": ("train", 0), "v4": ("test", 0)}


def test_pooled_scenes_cut_the_pool_by_scene_count() -> None:
    cfg = SplitConfig(seed=0, rule="pooled_scenes")
    rows = pooled_rows()
    assign_splits(rows, cfg)
    where = placed(rows)
    # 12 scenes: int(12 * 0.75) = 9 train, int(12 * 0.05) = 0 val, 3 test, whatever their questions.
    splits = [s for s, _ in where.values()]
    assert (splits.count("train"), splits.count("val"), splits.count("test")) == (9, 0, 3)
    # One seeded order over both benchmarks, its first scenes train and folds dealt round-robin.
    order = sorted(where, key=lambda s: rank(0, s))
    assert [where[s] for s in order] == [("train", i % 5) for i in range(9)] + [("test", i % 5) for i in range(9, 12)]
    again = pooled_rows()
    assign_splits(again, cfg)
    assert again == rows  # deterministic
    other = pooled_rows()
    assign_splits(other, SplitConfig(seed=1, rule="pooled_scenes"))
    assert placed(other) != where


def test_pooled_scenes_at_the_official_sizes_and_a_shared_name() -> None:
    # 20 scenes: 15 train, 1 val (0.05 * 20 is 1 despite binary floats), 4 test.
    rows = [{"benchmark": "u" if s % 2 else "v", "scene": f"s{s}", "uid": f"s{s}"} for s in range(20)]
    rows.append({"benchmark": "u", "scene": "s0", "uid": "s0-u"})  # the same name in the other benchmark
    assign_splits(rows, SplitConfig(seed=3, rule="pooled_scenes"))
    where = placed(rows)
    splits = [s for s, _ in where.values()]
    assert (splits.count("train"), splits.count("val"), splits.count("test")) == (15, 1, 4)
    assert len({r["split"] for r in rows if r["scene"] == "s0"}) == 1


def test_the_recipes_split_as_their_source() -> None:
    from embodied_r.config import load_recipe

    rules = {n: load_recipe(n).catalog.split.rule for n in ("paper", "official-script", "official-script-5gpu",
                                                             "improved", "demo")}
    assert rules == {"paper": "pooled_scenes", "official-script": "pooled_scenes",
                     "official-script-5gpu": "pooled_scenes", "improved": "per_benchmark", "demo": "per_benchmark"}
