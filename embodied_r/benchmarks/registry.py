"""The benchmarks, in the catalog's order: a benchmark is its module and its line here."""

from __future__ import annotations

from typing import Literal

from embodied_r.benchmarks import egoschema, mvbench, urbanvideo, vsibench
from embodied_r.benchmarks.base import OOD, SPLITS, Benchmark

BENCHMARKS: tuple[Benchmark, ...] = (urbanvideo.BENCHMARK, vsibench.BENCHMARK, egoschema.BENCHMARK, mvbench.BENCHMARK)

NAMES = tuple(b.name for b in BENCHMARKS)
Name = Literal[NAMES]  # type: ignore[valid-type]
TRAINING_BENCHMARKS = tuple(b.name for b in BENCHMARKS if not b.evaluation_only)
EVALUATION_BENCHMARKS = tuple(b.name for b in BENCHMARKS if b.evaluation_only)
_NAMED = {b.name: b for b in BENCHMARKS}


def get(name: str) -> Benchmark:
    return _NAMED[name]


def evaluation_only(name: str) -> bool:
    return name in EVALUATION_BENCHMARKS


def splits_of(name: str) -> tuple[str, ...]:
    return (OOD,) if evaluation_only(name) else SPLITS
