"""Embodied-R: a large VLM perceives, a small LM reasons, GRPO trains the reasoner."""

__version__ = "0.1.0"
