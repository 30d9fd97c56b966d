"""FFmpeg's messages, printed by OpenCV on file descriptor 2, kept for the video they are about."""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from contextlib import contextmanager
from typing import Iterator

# How FFmpeg starts each of its messages: "[mov,mp4,m4a,3gp,3g2,mj2 @ 0x55d0c0a0b700] ...".
_FFMPEG_LINE = re.compile(rb"^\[[^\]\n]* @ 0x[0-9a-f]+\] ")
_native_lock = threading.Lock()


@contextmanager
def ffmpeg_messages() -> Iterator[list[str]]:
    """FFmpeg's messages printed inside the block, for the caller to attach to its video (a bare
    "moov atom not found" names none); anything else is passed on."""
    found: list[str] = []
    with _native_lock, tempfile.TemporaryFile() as held:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            yield found
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            other = []
            for line in held.read().splitlines(keepends=True):
                if _FFMPEG_LINE.match(line):
                    found.append(" ".join(line[line.index(b"] ") + 2:].decode(errors="replace").split()))
                else:
                    other.append(line)
            if other:
                os.write(2, b"".join(other))
