"""The checks a machine gets before it trains (``check gpu``, ``check memory``), the training
environment's check (``env``) and the GPU recipes rehearsed on a CPU (``rehearse``).
May import: the core (``config`` included), ``backends``, ``scoring``, ``training`` and ``lifecycle``.
Only the apps import it."""
