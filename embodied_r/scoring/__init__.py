"""Scoring shared by training and evaluation: reading answers, the benchmarks' metrics, the
GRPO rewards and the paired comparison of two policies.

May import: the foundation (``benchmarks``) and ``backends``."""
