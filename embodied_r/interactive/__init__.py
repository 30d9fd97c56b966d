"""Embodied-Reasoner, the peer system: interactive observe-think-act tasks in a house.

Owns the task types and their groups, the episode metrics (success, search efficiency,
task completeness) and their aggregation, the ``Environment`` interface with a built-in
household stand-in and an AI2-THOR adapter (both under the original agent's legality rules),
the episode loop, the dataset (download,
catalog, synthetic sample and its scripted expert), the three SFT stages with rejection
sampling, what an evaluation in the built-in house is read beside (the scripted ceiling, the
free point of a policy that ends at once, the verdict), and the stage runners of the
``embodied-reasoner`` pipeline.

May import: the core (foundation modules, among them ``stage_plan``, which plans and keys its
stages as Embodied-R's), ``config`` (the recipe merge), ``backends``, ``prompts`` (the
original's texts) and the trainer machinery of ``training``: the SFT parent side (``sft``), the
trainer process both pipelines start (``sft_child``, on ``child``) and its settings
(``config.SFTSettings``), shared rather than copied. Never ``data``, ``evaluation``, ``perception``,
``keyframes`` or ``lifecycle``; ``tests/test_architecture.py`` holds it to this list.
"""
