"""The key-frame stage: decode (``video``), pick key frames by ORB + RANSAC overlap
(``extract``), cache them by video content (``cache``) and run over a catalog with a
per-video resume log and a process pool (``stage``); ``official`` picks them exactly as
the official code did (``mode: official``).

May import: the core (``io``, ``schemas``, ``paths``, ``progress``).
"""
