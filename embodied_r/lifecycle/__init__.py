"""A recipe's results beyond one pipeline run: evaluation of any model reference, registration
and promotion of the trained reasoner, its baselines and the SFT baseline, and a moved home.
May import: the core (``pipeline`` and ``config`` included) and the stage packages. The flows and
the apps build on it; nothing in the stage packages imports it."""
