"""Scoring shared by training and evaluation: answer parsing (``answers``), the benchmarks'
metrics (``metrics``) and the GRPO rewards (``rewards``: format, accuracy, and logical
consistency judged by a reference model through a backend, whose prompts are in
``reference_prompts``); how completions are read (``config``). Pure functions except the
consistency reward, which calls its backend.

May import: the foundation (``benchmarks``) and ``backends``.
"""
