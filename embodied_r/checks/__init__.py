"""The checks a machine gets before it trains: ``embodied-r check gpu`` (``make gpu-check``;
``gpu`` runs each check in a process of its own: the tiny models' in ``gpu_tiny``, the
recipe's policy step in ``gpu_policy``; ``--measure``: the policy shape's rates and the
schedule's GPU-hours, ``measure`` and ``projection``), ``embodied-r check memory`` (``gpu``), and the
training-environment check that ``infra/training/check-env.sh`` runs on CI (``env`` in the
project's environment, ``env_configs`` in the training environment), and the GPU recipes
rehearsed on a CPU with their real engines, ``make rehearse`` (``rehearse`` and
``rehearse_launches`` in the training environment's CPU replica; ``rehearse_verdicts``, what they
judge, pure). What they share is
in ``steps``: the records they train on, the tiny one-step training config, one GRPO step
of a reward schedule, the consistency reward asking its reference.

May import: the core (``config`` included), ``backends``, ``scoring``, ``training`` and
``lifecycle`` (the SFT config a recipe trains with). Only the apps import it.
"""
