"""Embodied-Reasoner, the peer system: its tasks and metrics, the built-in house and the AI2-THOR
adapter, the episode loop, its dataset, SFT stages and evaluation, and the pipeline's stage runners.
May import: the core, ``backends``, ``prompts`` and of ``training`` the SFT parent, its child and its
settings; never ``data``, ``evaluation``, ``perception``, ``keyframes`` or ``lifecycle``."""
