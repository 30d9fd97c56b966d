"""Reading videos without holding them in memory: unused frames are only ``grab()``-ed (the
colour conversion is paid on ``retrieve()``), decoding may run ahead in a second thread behind
a bounded queue, and the chosen frames' JPEGs wait in a temporary file; and the
``KeyframeResult`` both extraction modes return."""

from __future__ import annotations

import math
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import cv2
import numpy as np

from embodied_r.errors import VideoError
from embodied_r.keyframes.ffmpeg import ffmpeg_messages


# Containers often miscount by a frame or two; a stream short by more than this is damaged.
TRUNCATION_SHARE = 0.1
TRUNCATION_MIN_FRAMES = 3

# Frames of more pixels than this are decoded with FFmpeg's own threads by default.
AUTO_THREADS_MAX_PIXELS = 640 * 480


@dataclass
class KeyframeResult:
    video_path: str
    fps: float
    n_frames: int  # frames actually decoded
    width: int
    height: int
    sample_step: int
    n_samples: int
    indices: list[int]
    timestamps: list[float]
    overlaps: list[float]  # NaN where not measured (first, failed match, fill)
    reasons: list[str]
    images: list[bytes] | None = None  # JPEG bytes, one per kept frame
    seconds: float = 0.0
    passes: int = 1  # decoding passes: more than 1 only for containers that miscount their frames

    @classmethod
    def of(cls, video_path: str | Path, info: "VideoInfo", step: int, n_frames: int, n_samples: int,
           kept: list[tuple[int, float, str]], images: list[bytes] | None, start: float,
           passes: int) -> "KeyframeResult":
        """From the kept ``(index, overlap, reason)``; ``start``: ``time.perf_counter()`` at the start."""
        return cls(str(video_path), info.fps, n_frames, info.width, info.height, step, n_samples,
                   [k[0] for k in kept], [k[0] / info.fps for k in kept], [k[1] for k in kept], [k[2] for k in kept],
                   images, time.perf_counter() - start, passes)

    def __len__(self) -> int:
        return len(self.indices)


@dataclass(frozen=True)
class VideoInfo:
    path: str
    fps: float
    frame_count: int  # as the container reports it; 0 when unknown, sometimes an estimate
    width: int
    height: int


def auto_decode_threads(width: int, height: int) -> int:
    """FFmpeg threads for frames of this size: 1 up to ``AUTO_THREADS_MAX_PIXELS``, else 0 (its own).
    Measured on 2 cores: at 640x360 its frame threads cost a third more CPU for little time; at
    1280x720 decoding is the longer path and they shorten it (6.3 s to 3.7 s for 180 s of video)."""
    return 1 if width * height <= AUTO_THREADS_MAX_PIXELS else 0


def open_video(path: str | Path, threads: int | None = 0) -> tuple[cv2.VideoCapture, VideoInfo]:
    """Or raise ``VideoError`` saying why it cannot be used. ``threads``: FFmpeg's; 0: OpenCV's
    default (one per core), None: by frame size."""
    p = Path(path)
    if not p.is_file():
        raise VideoError("missing", p, "no such file")
    if p.stat().st_size == 0:
        raise VideoError("empty", p, "the file is empty (0 bytes)")
    if threads is None:
        # The size is known only once the file is open: open with one thread, reopen if large.
        cap, info = open_video(p, 1)
        if auto_decode_threads(info.width, info.height) == 1:
            return cap, info
        cap.release()
        return open_video(p, 0)
    with ffmpeg_messages() as said:
        cap = cv2.VideoCapture(str(p), cv2.CAP_ANY, [cv2.CAP_PROP_N_THREADS, threads]) if threads > 0 else \
            cv2.VideoCapture(str(p))
    if not cap.isOpened():
        raise VideoError("unreadable", p, "OpenCV/FFmpeg cannot open it (corrupt or unsupported)"
                         + (f"; FFmpeg says: {'; '.join(dict.fromkeys(said))}" if said else ""))
    fps = cap.get(cv2.CAP_PROP_FPS)
    if not math.isfinite(fps) or fps <= 0:
        cap.release()
        raise VideoError("no_fps", p, f"the container reports {fps} frames per second")
    count = cap.get(cv2.CAP_PROP_FRAME_COUNT)
    info = VideoInfo(str(p), float(fps), int(count) if math.isfinite(count) and count > 0 else 0,
                     int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
    return cap, info


def probe_video(path: str | Path) -> VideoInfo:
    cap, info = open_video(path)
    cap.release()
    return info


class FrameSampler:
    """Yield ``(index, image, is_last)`` for frames 0, step, 2*step, ... (``step = round(fps /
    sample_fps)``) and the last, found from the container's count on; a container that
    over-reports its length gets its true last frame in a second pass. ``ahead`` > 0 decodes in a
    second thread that many frames ahead; the frames are the same either way."""

    def __init__(self, path: str | Path, sample_fps: float = 1.0, *, threads: int | None = 0, ahead: int = 0):
        if sample_fps <= 0:
            raise ValueError(f"sample_fps must be positive, got {sample_fps}")
        self.cap, self.info = open_video(path, threads)
        self.threads = threads
        self.step = max(1, round(self.info.fps / sample_fps))
        self.frames_read = 0
        self.passes = 1
        self.ahead = ahead
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None

    def __enter__(self) -> "FrameSampler":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop_worker()
        self.cap.release()

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, bool]]:
        return self._decode_ahead() if self.ahead > 0 else self._frames()

    def _decode_ahead(self) -> Iterator[tuple[int, np.ndarray, bool]]:
        if self._worker is not None:
            raise RuntimeError("a FrameSampler can be iterated once")
        frames: queue.Queue = queue.Queue(maxsize=self.ahead)
        stop = self._stop

        def put(item: object) -> bool:
            while not stop.is_set():
                try:
                    frames.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for item in self._frames():
                    if not put(item):
                        return  # the caller stopped early
                put(_END)
            except BaseException as e:  # handed to the caller, raised there
                put(_Failure(e))

        self._worker = threading.Thread(target=work, name="frame-sampler", daemon=True)
        self._worker.start()
        try:
            while True:
                item = frames.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            self._stop_worker()

    def _stop_worker(self) -> None:
        # The decoding thread must be gone before the capture is released under it.
        if self._worker is not None:
            self._stop.set()
            self._worker.join()

    def _frames(self) -> Iterator[tuple[int, np.ndarray, bool]]:
        # Unknown length: every frame is a last-frame candidate (slower, still correct).
        tail_from = self.info.frame_count - 1 if self.info.frame_count > 0 else 0
        pending: tuple[int, np.ndarray, bool] | None = None
        index = -1
        while self.cap.grab():
            index += 1
            sampled = index % self.step == 0
            if not (sampled or index >= tail_from):
                continue
            ok, image = self.cap.retrieve()
            if not ok or image is None:
                index -= 1  # a frame that cannot be converted ends the usable stream
                break
            if pending is not None and pending[2]:
                yield pending[0], pending[1], False
            pending = (index, image, sampled)
        self.frames_read = index + 1
        if pending is None:
            raise VideoError("no_frames", self.info.path, "no frame could be decoded")
        if pending[0] < index:
            last = read_frames(self.info.path, [index], self.threads).get(index)
            self.passes += 1
            if last is not None:
                if pending[2]:
                    yield pending[0], pending[1], False
                yield index, last, True
                self._check_complete()
                return
            self.frames_read = pending[0] + 1  # the tail cannot be decoded: the stream ends earlier
        yield pending[0], pending[1], True
        self._check_complete()

    def _check_complete(self) -> None:
        """A stream that stops well short of the container's count is damaged: its key frames
        would silently cover part of the video."""
        expected, got = self.info.frame_count, self.frames_read
        if (expected and expected - got > max(TRUNCATION_MIN_FRAMES, TRUNCATION_SHARE * expected)
                and _decodes_at(self.info.path, (got + expected) // 2)):
            # Frames exist past where decoding stopped: damaged data, not a header that
            # merely over-counts (those are read to their true end and kept).
            raise VideoError("truncated", self.info.path,
                             f"decoded {got} of the {expected} frames the container reports")


_END = object()


@dataclass
class _Failure:
    error: BaseException


def _decodes_at(path: str | Path, index: int) -> bool:
    cap = cv2.VideoCapture(str(path))
    try:
        cap.set(cv2.CAP_PROP_POS_FRAMES, index)
        return bool(cap.grab()) and cap.retrieve()[0]
    finally:
        cap.release()


def read_frames(path: str | Path, indices: Iterable[int], threads: int | None = 0) -> dict[int, np.ndarray]:
    """Decode the given frames in one forward pass (grab the rest); missing ones are left out."""
    wanted = sorted(set(int(i) for i in indices))
    out: dict[int, np.ndarray] = {}
    if not wanted:
        return out
    cap, _ = open_video(path, threads)
    try:
        index, k = -1, 0
        while k < len(wanted) and cap.grab():
            index += 1
            if index == wanted[k]:
                ok, image = cap.retrieve()
                if ok and image is not None:
                    out[index] = image
                k += 1
    finally:
        cap.release()
    return out


class JpegSpool:
    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()
        self.where: dict[int, tuple[int, int]] = {}

    def put(self, index: int, data: bytes) -> None:
        self.file.seek(0, os.SEEK_END)
        self.where[index] = (self.file.tell(), len(data))
        self.file.write(data)

    def get(self, index: int) -> bytes:
        offset, size = self.where[index]
        self.file.seek(offset)
        return self.file.read(size)

    def take(self, path: str | Path, indices: list[int], cfg: Any) -> tuple[list[bytes], int]:
        """The JPEGs of ``indices``, those not held decoded again (a container that miscounted
        its frames); and the extra passes that took."""
        missing = [i for i in indices if i not in self.where]
        if missing:
            frames = read_frames(path, missing, cfg.decode_threads)
            for i in missing:
                if i not in frames:
                    raise VideoError("unreadable", path, f"frame {i} could not be decoded again")
                self.put(i, encode_jpeg(frames[i], cfg))
        return [self.get(i) for i in indices], int(bool(missing))

    def close(self) -> None:
        self.file.close()


def encode_jpeg(image: np.ndarray, cfg: Any) -> bytes:
    """JPEG bytes, the longest side at most ``cfg.jpeg_max_side`` (0: as it is)."""
    h, w = image.shape[:2]
    if cfg.jpeg_max_side and max(h, w) > cfg.jpeg_max_side:
        s = cfg.jpeg_max_side / max(h, w)
        image = cv2.resize(image, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, cfg.jpeg_quality])
    if not ok:
        raise VideoError("encode_failed", "", "JPEG encoding failed")
    return buf.tobytes()
