"""Experiments: named sets of recipe variants run at several seeds and compared on the same
questions. Owns the declarations (``recipes/experiments/*.yaml``, or a user's YAML file),
the variants' overrides, the equal-compute budget of an SFT variant, and the pure comparison
of finished runs (the table, paired tests against the baseline variant). Running them is the
``embodied-r-experiment`` flow's (``flows.experiment``).

May import: the core, ``config``, ``scoring`` and ``evaluation`` (the failure signatures).
"""
