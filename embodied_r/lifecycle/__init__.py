"""A recipe's results beyond one run of the pipeline: evaluation of any model reference (a
folder, ``tiny:lm``, a registry URI) in a folder keyed like a stage (``models``),
registration and promotion of the trained reasoner (``promote``), the baselines beside it
(``baselines``) and the SFT baseline (``sft_baseline``).

May import: the core (``pipeline`` and ``config`` included) and the stage packages. The
flows and the apps build on it; nothing in the stage packages imports it.
"""
