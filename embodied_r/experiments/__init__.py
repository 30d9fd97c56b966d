"""Experiments: named sets of recipe variants run at several seeds and compared on the same
questions. Owns their declarations, the variants' overrides and the pure comparison of runs.
May import: the core, ``config``, ``scoring`` and ``evaluation`` (the failure signatures)."""
