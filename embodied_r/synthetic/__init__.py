"""The synthetic benchmark: UrbanVideo-style flights and VSI-style room scans in the real
datasets' layouts, answers right by construction. May import: the foundation, and
``keyframes.ffmpeg`` for FFmpeg's messages.
"""
