"""A small synthetic benchmark laid out exactly like UrbanVideo-Bench and VSI-Bench.

Every answer is computed from the generator's own camera path, object layout and per-frame
visibility, so it is right by construction; the same seed gives byte-identical files. It is small
enough for a CPU: the demo shows the method learning on it, not the paper's results.

The parts: ``world`` (camera paths, objects, rendering), ``urban`` (UrbanVideo-style flights
and questions) and ``vsi`` (VSI-style room scans and questions); ``config`` holds the
settings. This module is the entry point.
"""

from __future__ import annotations

import time
from pathlib import Path

from embodied_r.synthetic.config import SyntheticConfig
from embodied_r.synthetic.filming import Crew
from embodied_r.synthetic.urban import write_urban_bench
from embodied_r.synthetic.vsi import write_vsi_bench


def make_synthetic_benchmark(root: Path, cfg: SyntheticConfig | None = None, workers: int | None = None) -> dict:
    """Write ``root/UrbanVideo-Bench`` and ``root/VSI-Bench`` as the hub repos lay them out, the
    videos filmed by ``workers`` processes (default: one per core; 1: in this process). The
    files are the same whatever the number."""
    cfg = cfg or SyntheticConfig()
    start = time.perf_counter()
    root = Path(root)
    with Crew(workers) as crew:
        counts = {**write_urban_bench(root, cfg, crew), **write_vsi_bench(root, cfg, crew)}
    return {**counts, "seconds": round(time.perf_counter() - start, 3), "workers": crew.workers}
