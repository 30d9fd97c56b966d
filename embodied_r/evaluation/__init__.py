"""The evaluation stage: answer and score a split, its report, the learning figures, the MLflow
model registry and promotion to an alias.
May import: the core, ``backends`` and ``scoring``."""
