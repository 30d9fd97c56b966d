"""The data stages: download (hub, local mirror or the synthetic benchmark; ``hub`` fetches
and verifies a pinned revision) and the catalog (one questions table, parsed options,
seeded scene-disjoint splits; ``ood`` reads the evaluation-only benchmarks, whose questions
are all in the ``ood`` split).

May import: the core (``io``, ``schemas``, ``benchmark_rules``, ``paths``) and ``synthetic``.
"""
