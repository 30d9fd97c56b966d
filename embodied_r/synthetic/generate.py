"""The synthetic benchmark's entry: each benchmark's twin written; the same seed gives
byte-identical files."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from embodied_r.benchmarks import registry
from embodied_r.synthetic.config import SyntheticConfig
from embodied_r.synthetic.filming import Crew


def make_synthetic_benchmark(root: Path, cfg: SyntheticConfig | None = None, workers: int | None = None) -> dict:
    """``workers``: filming processes (default one per core; 1: in this process)."""
    cfg = cfg or SyntheticConfig()
    start = time.perf_counter()
    root = Path(root)
    counts: dict = {}
    with Crew(workers) as crew:
        for benchmark in registry.BENCHMARKS:
            if benchmark.synthetic:
                module, function = benchmark.synthetic.split(":")
                counts.update(getattr(importlib.import_module(module), function)(root, cfg, crew))
    return {**counts, "seconds": round(time.perf_counter() - start, 3), "workers": crew.workers}
