"""Embodied-R: spatial reasoning over egocentric video.

The core lives at the top of this package: ``config`` (the recipe), ``pipeline`` (the stage
graph and its hashes), ``runners`` (the registry of stage runners and their code versions),
``tracking`` (MLflow: the store, its runs and a run's record), ``io`` (stage folders and
Parquet), ``schemas`` (the Parquet contracts), ``benchmarks`` (one module per benchmark, and
their list), ``paths`` and ``progress``. One sub-package per concern sits beside it;
``docs/architecture.md`` draws both graphs.
"""

__version__ = "0.1.0"
