"""The data stages, generic over the benchmark registry: download (hub, local mirror or the
synthetic benchmark) and the catalog with its seeded scene-disjoint splits. May import: the
foundation and ``synthetic``.
"""
