"""Images as the backends send them: scaled to a pixel budget, and for HTTP encoded once
as JPEG data URLs and kept in a small cache shared by every call of the process."""

from __future__ import annotations

import base64
import io
import math
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path

from PIL import Image


# ``png-nearest``: as Embodied-Reasoner's inference server prepared its training images.
ENCODINGS = {"jpeg-bilinear": ("JPEG", Image.BILINEAR), "png-nearest": ("PNG", Image.NEAREST)}


def load_image(path: str | Path, max_pixels: int, encoding: str = "jpeg-bilinear") -> Image.Image:
    """An RGB image scaled down (never up) to at most ``max_pixels`` pixels."""
    with Image.open(path) as img:
        img = img.convert("RGB")
    w, h = img.size
    if w * h > max_pixels:
        scale = math.sqrt(max_pixels / (w * h))
        # Pillow's bilinear resize is antialiased (its support grows with the scale); bicubic
        # costs about 1.6x the CPU, which is most of what sending a key frame costs.
        img = img.resize((max(1, int(w * scale)), max(1, int(h * scale))), ENCODINGS[encoding][1])
    return img


def encode_image(path: str, max_pixels: int, encoding: str = "jpeg-bilinear") -> str:
    """A data URL; a file already in the encoding's format and within the budget is sent as it
    is, keeping the quality it was saved with."""
    fmt = ENCODINGS[encoding][0]
    with Image.open(path) as probe:
        as_is = probe.format == fmt and probe.mode in ("RGB", "L") and probe.width * probe.height <= max_pixels
    if as_is:
        data = Path(path).read_bytes()
    else:
        buf = io.BytesIO()
        load_image(path, max_pixels, encoding).save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        data = buf.getvalue()
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(data).decode("ascii")


class ImageCache:
    """Encoded key frames, most recently used kept, each encoded once even when many calls
    (up to ``concurrency`` in per_question mode) ask for it at once; a file rewritten in place is
    encoded again."""

    def __init__(self, size: int = 256):  # about 256 x 50 kB
        self.size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, int, int, int, str], Future[str]] = OrderedDict()

    def get(self, path: str, max_pixels: int, encoding: str = "jpeg-bilinear") -> str:
        stat = os.stat(path)
        key = (str(path), stat.st_mtime_ns, stat.st_size, max_pixels, encoding)
        with self._lock:
            future = self._items.get(key)
            owner = future is None
            if owner:
                future = self._items[key] = Future()
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
            else:
                self._items.move_to_end(key)
        if owner:
            try:
                future.set_result(encode_image(path, max_pixels, encoding))
            except BaseException as exc:
                future.set_exception(exc)
                with self._lock:
                    if self._items.get(key) is future:
                        del self._items[key]  # a later call tries again
        return future.result()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


IMAGES = ImageCache()


def image_data_url(path: str, max_pixels: int, encoding: str = "jpeg-bilinear") -> str:
    return IMAGES.get(path, max_pixels, encoding)
