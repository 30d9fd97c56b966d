"""The Embodied-R training stages (convert, warm start, GRPO), the SFT run both pipelines share,
and what a trainer needs settled before it starts: policy, memory, disk.

May import: the core, ``backends`` and ``scoring``."""
