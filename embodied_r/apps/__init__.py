"""What a user runs: the ``embodied-r`` command line (``cli`` and its ``cli_*`` parts, which
start the Prefect flows), batch inference on new videos (``inference``), video chat
(``chat``). ``embodied-r check`` is the ``checks`` package's own.

May import: anything in the library, and ``flows``; nothing imports it.
"""
