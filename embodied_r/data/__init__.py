"""The data stages: download (hub, local mirror or the synthetic benchmark; ``hub`` fetches
and verifies a pinned revision) and the catalog (one questions table, parsed options,
seeded scene-disjoint splits).

May import: the core (``io``, ``schemas``, ``benchmark_rules``, ``paths``) and ``synthetic``.
"""
