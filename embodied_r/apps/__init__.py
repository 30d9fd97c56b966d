"""What a user runs: the ``embodied-r`` command line (``cli`` and its ``cli_*`` parts, which
start the Prefect flows), batch inference on new videos (``inference``), video chat
(``chat``), and the checks a user runs first on a GPU machine (``gpu_check``).

May import: anything in the library, and ``flows``; nothing imports it.
"""
