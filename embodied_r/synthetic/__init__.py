"""The synthetic benchmark: a small world of camera paths and objects (``world``), rendered
into UrbanVideo-style flights (``urban``) and VSI-style room scans (``vsi``) in the real
datasets' file layouts, with answers right by construction (``generate`` is the entry).

May import: the foundation (``io``; ``benchmarks`` for the real layouts and schemas), and
``keyframes.ffmpeg`` for FFmpeg's messages.
"""
