"""A small synthetic benchmark laid out exactly like the real ones that have a synthetic twin
(``urban``, ``vsi``): every answer computed from the generator's own world, so right by
construction; the same seed gives byte-identical files. This module is the entry point."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

from embodied_r.benchmarks import registry
from embodied_r.synthetic.config import SyntheticConfig
from embodied_r.synthetic.filming import Crew


def make_synthetic_benchmark(root: Path, cfg: SyntheticConfig | None = None, workers: int | None = None) -> dict:
    """Write each twin's folder (``root/UrbanVideo-Bench``, ``root/VSI-Bench``) as the hub repos lay
    them out, the videos filmed by ``workers`` processes (default: one per core; 1: in this
    process). The files are the same whatever the number."""
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
