"""The perception stage: the perceiver's prompts, the reading of its replies, the call plans
of its modes and the resumable stage. May import: the core and ``backends``.
"""
