"""The evaluation stage: answer and score a split (``stage``, config in ``config``), the
report beside the paper's Table 1 (``report``), the learning figures (``learning``), the MLflow
model registry (``registry``) and promotion to an alias past chance, the warm start and the
champion (``promotion``).

May import: the core, ``backends`` and ``scoring``.
"""
