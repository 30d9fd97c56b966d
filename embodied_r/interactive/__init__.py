"""Embodied-Reasoner, the peer system: interactive observe-think-act tasks in a house.

Owns the task types and their groups, the episode metrics (success, search efficiency,
task completeness) and their aggregation, the ``Environment`` interface with a built-in
household stand-in and an AI2-THOR adapter (both under the original agent's legality rules),
the episode loop, the dataset (download,
catalog, synthetic sample), the three SFT stages with rejection sampling, and the stage
runners of the ``embodied-reasoner`` pipeline.

May import: the core (foundation modules) and ``backends``. Never the internals of other
stage packages (``data``, ``training``, ``evaluation``, ...): where a pattern is shared (the
trainer child, the hub download) it is followed, or the foundation's piece is reused.
"""
