"""The evaluation stage: answer and score a split (``stage``, config in ``config``), the
report beside the paper's Table 1 (``report``) and the MLflow model registry
(``registry``).

May import: the core, ``backends`` and ``scoring``.
"""
