"""The perception stage: the perceiver's prompts and reply schemas (``prompts``), robust
reading of its replies (``parse``), per-question and per-video call plans (``modes``), and the
resumable stage over every question (``stage``).

May import: the core and ``backends``.
"""
