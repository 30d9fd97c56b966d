"""What a user runs: the ``embodied-r`` command line (``cli`` and its ``cli_*`` parts), batch
inference on new videos and video chat.
May import: anything in the library, and ``flows``; nothing imports it."""
