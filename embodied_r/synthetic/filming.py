"""Filming the synthetic videos in worker processes while this process plans the next worlds.
A video's bytes depend on its ``Shot`` only (every random draw is made here, beforehand), so
the files are the same whichever worker writes them and however many there are."""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from embodied_r.children import children_deaf_to_ctrl_c
from embodied_r.synthetic.world import (HFOV, Backdrop, Pose, Segment, Thing, draw_thing, paint, pose_at,
                                         write_frames)


@dataclass(frozen=True)
class Shot:
    """One world's footage; ``outputs``: each clip's path and frame count (clips of one world
    are prefixes of one flight)."""

    backdrop: Backdrop
    things: tuple[Thing, ...]
    segments: tuple[Segment, ...]
    start: Pose
    outputs: tuple[tuple[Path, int], ...]
    fps: float
    width: int
    height: int

    def pose(self, t: float) -> Pose:
        return pose_at(self.segments, t, self.start)


def film(shot: Shot) -> None:
    pano = paint(shot.backdrop)
    for thing in shot.things:
        draw_thing(pano, thing, shot.width / HFOV)
    write_frames(pano, shot.pose, shot.outputs, shot.fps, shot.width, shot.height)


def _init_worker(parent: int) -> None:
    import cv2

    from embodied_r.children import die_with_parent

    die_with_parent(parent)
    # One OpenCV thread per worker: the workers already fill the cores.
    cv2.setNumThreads(1)


def worker_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Crew:
    """Films shots in worker processes (``workers`` 1: here, at once). ``then`` callbacks run
    here, in the order the shots were given, once each shot and those before it are filmed;
    at most a few shots per worker wait at a time, so the panoramas in flight stay few."""

    def __init__(self, workers: int | None = None):
        self.workers = worker_count() if workers is None else max(1, workers)
        self._pool: ProcessPoolExecutor | None = None
        self._queue: deque[tuple[Future[None], Callable[[], Any] | None]] = deque()

    def __enter__(self) -> "Crew":
        if self.workers > 1:
            # spawn: a forked child would inherit OpenCV's and FFmpeg's thread pools in a broken state.
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init_worker, initargs=(os.getpid(),))
        return self

    def submit(self, shot: Shot, then: Callable[[], Any] | None = None) -> None:
        if self._pool is None:
            film(shot)
            if then is not None:
                then()
            return
        with children_deaf_to_ctrl_c():  # the pool starts its workers as shots are submitted
            self._queue.append((self._pool.submit(film, shot), then))
        while len(self._queue) > 2 * self.workers:
            self._finish_one()

    def wait(self) -> None:
        while self._queue:
            self._finish_one()

    def abandon(self) -> None:
        """Drop the shots not yet filmed, wait for those being filmed, their ``then`` and errors
        left aside (the caller is already handling an error)."""
        queued, self._queue = list(self._queue), deque()
        for future, _ in queued:
            future.cancel()
        for future, _ in queued:
            if not future.cancelled():
                future.exception()

    def _finish_one(self) -> None:
        future, then = self._queue.popleft()
        future.result()  # a worker's error is raised here
        if then is not None:
            then()

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        try:
            if kind is None:
                self.wait()
            else:
                self.abandon()
        finally:
            if self._pool is not None:
                # After an error no shot is left running: the caller cleans up what they wrote.
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
            self._queue.clear()
