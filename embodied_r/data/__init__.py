"""The data stages, generic over ``benchmarks.registry``: download (hub, local mirror or the
synthetic benchmark; ``hub`` fetches and verifies a pinned revision), the catalog (one questions
table, seeded scene-disjoint splits; an evaluation-only benchmark's questions all in ``ood``)
and their config models (``config``, light). May import: the foundation and ``synthetic``.
"""
