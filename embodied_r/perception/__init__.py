"""The perception stage: the perceiver's prompts and reply schemas (``prompts``), robust
reading of its replies (``parse``), per-question and per-video call plans (``modes``), the
resumable stage over every question (``stage``), and the demo's tiny perceiver trained on
synthetic clips (``perceiver``, its calls, targets and scores in ``perceiver_data``).

May import: the core, ``backends``, ``synthetic`` (the clips the demo perceiver learns from) and
``keyframes`` (whose rule picks the key frames of those clips).
"""
