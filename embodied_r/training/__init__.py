"""The training stages: GRPO records from the perception text (``records``, the convert
stage), the stage configs (``config``), the trainer process and its launch
(``environment``), the GRPO stage's parent side (``stage``) and child (``grpo``), and the
SFT baseline's trainer (``sft``, child ``sft_child``).

May import: the core, ``backends`` and ``scoring``.
"""
