"""Preprocess stage: the benchmarks into one questions table, with seeded scene-disjoint splits
of the training benchmarks; every question of an evaluation-only benchmark is in ``ood``."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import duckdb
import pyarrow.parquet as pq

from embodied_r import schemas
from embodied_r.benchmarks import registry
from embodied_r.benchmarks.base import ALL_SPLITS, OOD, Keep
from embodied_r.data.config import CatalogConfig, SplitConfig
from embodied_r.errors import CatalogError
from embodied_r.io import (is_complete, item_done, read_summary, stage_folder, table_from_records, write_parquet_atomic,
                           write_summary)
from embodied_r.synthetic.truth import FACTS_FILE


def _facts(base: Path) -> dict[str, str]:
    """Question id -> what decides its answer (JSON); empty for the real benchmarks."""
    path = base / FACTS_FILE
    if not path.is_file():
        return {}
    return {r["question_id"]: json.dumps({"kind": r["kind"], "objects": list(r["objects"] or [])})
            for r in pq.read_table(path).to_pylist()}


# ``tasks: paper``: each benchmark's own (of those the recipe downloads).
_PAPER = frozenset(t for b in registry.BENCHMARKS for t in b.tasks)


def _keep(tasks: Literal["paper", "all"] | list[str]) -> Keep:
    """A task is named as written in the source or in its metric form."""
    if tasks == "all":
        return lambda category: True
    if tasks == "paper":
        return _PAPER.__contains__
    names = {metric_name(t) for t in tasks}
    return lambda category: metric_name(category) in names


def _wanted(rows: list[dict], tasks: Literal["paper", "all"] | list[str]) -> list[dict]:
    if isinstance(tasks, list):
        known = {metric_name(r["category"]) for r in rows}
        unknown = [t for t in tasks if metric_name(t) not in known]
        if unknown:
            names = sorted({r["category"] for r in rows})
            raise CatalogError(f"unknown task(s) {', '.join(map(repr, unknown))}; the source has: {', '.join(names)}")
    keep = _keep(tasks)
    return [r for r in rows if keep(r["category"])]


def _stable_rank(seed: int, key: str) -> str:
    # sha256, not hash(): the same split on every machine and Python version.
    return hashlib.sha256(f"{seed}\0{key}".encode()).hexdigest()


def assign_splits(rows: list[dict], cfg: SplitConfig) -> None:
    """Into each row's ``split`` and ``fold``; an evaluation-only benchmark's rows are all in
    ``ood``, so no rule, seed or fraction can put one in training."""
    held = [r for r in rows if registry.evaluation_only(r["benchmark"])]
    split = [r for r in rows if not registry.evaluation_only(r["benchmark"])]
    split_of = pooled_scene_splits(split, cfg) if cfg.rule == "pooled_scenes" else per_benchmark_splits(split, cfg)
    for r in split:
        r["split"], r["fold"] = split_of[(r["benchmark"], r["scene"])]
    for r in held:
        r["split"], r["fold"] = OOD, 0


def per_benchmark_splits(rows: list[dict], cfg: SplitConfig) -> dict[tuple[str, str], tuple[str, int]]:
    by_bench: dict[str, Counter] = {}
    for r in rows:
        by_bench.setdefault(r["benchmark"], Counter())[r["scene"]] += 1
    split_of: dict[tuple[str, str], tuple[str, int]] = {}
    for bench, counts in by_bench.items():
        scenes = sorted(counts, key=lambda s: _stable_rank(cfg.seed, f"{bench}/{s}"))
        total = sum(counts.values())
        bounds = [("train", cfg.train * total), ("val", (cfg.train + cfg.val) * total)]
        seen = 0
        for i, scene in enumerate(scenes):
            split = next((name for name, bound in bounds if seen < bound), "test")
            # A tiny benchmark still gets a test scene: the last scene is never trained on.
            if i == len(scenes) - 1 and len(scenes) > 1 and cfg.test > 0:
                split = "test"
            split_of[(bench, scene)] = (split, i % cfg.folds)
            seen += counts[scene]
    return split_of


def pooled_scene_splits(rows: list[dict], cfg: SplitConfig) -> dict[tuple[str, str], tuple[str, int]]:
    """The official rule: all benchmarks' scene names in one seeded pool (a shared name is one
    scene), cut by scene count."""
    scenes = sorted({r["scene"] for r in rows}, key=lambda s: _stable_rank(cfg.seed, s))
    # The official sizes are truncated; the epsilon keeps 0.05 * 20 at 1 despite binary floats.
    n_train = int(len(scenes) * cfg.train + 1e-9)
    n_val = int(len(scenes) * cfg.val + 1e-9)
    place = {s: ("train" if i < n_train else "val" if i < n_train + n_val else "test", i % cfg.folds)
             for i, s in enumerate(scenes)}
    return {(r["benchmark"], r["scene"]): place[r["scene"]] for r in rows}


def _cap(rows: list[dict], cap: int | None, seed: int) -> list[dict]:
    if cap is None:
        return rows
    kept: Counter = Counter()
    out = []
    for r in sorted(rows, key=lambda r: _stable_rank(seed, r["uid"])):
        if kept[(r["benchmark"], r["category"])] < cap:
            kept[(r["benchmark"], r["category"])] += 1
            out.append(r)
    return sorted(out, key=lambda r: (r["benchmark"], r["uid"]))


def build_catalog(raw: Path, cfg: CatalogConfig) -> tuple[list[dict], list[dict]]:
    raw = Path(raw)
    failures: list[dict] = []
    rows: list[dict] = []
    for benchmark in registry.BENCHMARKS:
        base = raw / benchmark.folder
        if base.exists():
            facts = _facts(base)
            read = benchmark.read(base, failures, _keep(cfg.tasks))
            rows += [{**r, "fact": facts.get(r["original_id"], "")} for r in read]
    if not rows and not failures:
        folders = ", ".join(f"{b.folder}/" for b in registry.BENCHMARKS)
        raise CatalogError(f"{raw} holds none of {folders}: run the download stage")
    rows = _wanted(rows, cfg.tasks)
    present = []
    for r in rows:
        if Path(r["video_path"]).is_file():
            present.append(r)
        else:
            failures.append({"stage": "preprocess", "item": r["uid"],
                             "reason": f"video_missing: {r['video_id']} (expected at {r['video_path']})"})
    present = _cap(present, cfg.max_questions_per_task, cfg.split.seed)
    assign_splits(present, cfg.split)
    return present, failures


def split_counts(rows: list[dict]) -> dict[str, dict[str, dict[str, int]]]:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for r in rows:
        per_split = out.setdefault(r["benchmark"], {}).setdefault(r["category"],
                                                                  dict.fromkeys(registry.splits_of(r["benchmark"]), 0))
        per_split[r["split"]] += 1
    return out


def metric_name(task: str) -> str:
    """``Start/End Position`` -> ``start_end_position``: a '/' would add a metric level."""
    return re.sub(r"[^a-z0-9]+", "_", task.lower()).strip("_") or "unnamed"


def metric_counts(rows: list[dict]) -> dict[str, dict[str, dict[str, int]]]:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for bench, tasks in split_counts(rows).items():
        for task, per_split in tasks.items():
            merged = out.setdefault(bench, {}).setdefault(metric_name(task), dict.fromkeys(registry.splits_of(bench), 0))
            for split, n in per_split.items():
                merged[split] += n
    return out


_VIEWS = {
    "counts": "SELECT benchmark, category, split, count(*) AS n FROM questions GROUP BY ALL ORDER BY ALL",
    "videos": "SELECT DISTINCT benchmark, video_id, video_path, scene, split FROM questions",
    "splits": "SELECT split, count(*) AS n, count(DISTINCT scene) AS scenes FROM questions GROUP BY ALL",
}


def run_catalog(raw: Path, out: Path, cfg: CatalogConfig) -> dict:
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    start = time.time()
    rows, failures = build_catalog(raw, cfg)
    with stage_folder(out) as work:
        # Items, for a test's kill at a known point: the files written.
        write_parquet_atomic(table_from_records(rows, schemas.CATALOG), work / "catalog.parquet")
        item_done("preprocess")
        write_parquet_atomic(table_from_records(failures, schemas.FAILURES), work / "failures.parquet")
        item_done("preprocess")
        db = work / "catalog.duckdb"
        db.unlink(missing_ok=True)
        with duckdb.connect(str(db)) as con:
            # Copied in, not read by path: the database survives the folder being moved.
            con.execute("CREATE TABLE questions AS SELECT * FROM read_parquet(?)",
                        [str(work / "catalog.parquet")])
            for name, sql in _VIEWS.items():
                con.execute(f"CREATE VIEW {name} AS {sql}")
        item_done("preprocess")
        summary: dict = {"questions": len(rows), "videos": len({r["video_path"] for r in rows}),
                         "failed": len(failures),
                         "failure_reasons": dict(Counter(f["reason"].split(":")[0] for f in failures)),
                         "seconds": round(time.time() - start, 3)}
        for split in ALL_SPLITS:
            summary[f"n_{split}"] = sum(1 for r in rows if r["split"] == split)
        summary["splits"] = {b: {s: sum(n[s] for n in tasks.values()) for s in registry.splits_of(b)}
                             for b, tasks in split_counts(rows).items()}
        summary["counts"] = metric_counts(rows)
        write_summary(work, summary)
    return summary


def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    return run_catalog(Path(inputs["raw"]), out, CatalogConfig.model_validate(config))
