"""A full disk, an unusable or read-only home and refused or damaged inputs, for ``benchmarks/faults.py``.

Each case runs the test of the same fault (``tests/faults/test_fault_disk.py`` and its neighbours), on
real small tmpfs file systems; where none can be mounted (not root) the case says so.
"""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from benchmarks.fault_kills import OK_ERROR, RECOVERED, case


@contextmanager
def _disks(tmp: Path) -> Iterator[Callable[[str, str], Path]]:
    from tests.faults.test_fault_disk import NO_MOUNT, _mount

    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        if not _mount(tmp / name, options):
            raise RuntimeError(NO_MOUNT)
        mounted.append(tmp / name)
        return tmp / name

    try:
        yield make
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", "-l", str(point)], capture_output=True)


@case("disk fills during download (home on 8 MB), rerun with room")
def _stage_disk(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_disk import test_a_disk_that_fills_during_a_stage_stops_it_in_one_line_and_the_rerun_finishes as t

    with _disks(tmp) as disk:
        t(disk, tmp)
    return "one line naming the folder, what is free and the fix; not retried; rerun finished", RECOVERED


@case("tracking store's disk fills mid-run, rerun with room")
def _store_disk(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_disk import test_a_tracking_store_whose_disk_fills_is_said_once_and_then_skipped as t

    with _disks(tmp) as disk:
        t(disk, tmp)
    return "said once, later calls skipped, the stage finished untracked; rerun logged it", RECOVERED


@case("project home under a file, read-only, full")
def _home(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_disk import test_an_unusable_home_is_named_as_the_project_home_with_its_fix as t

    for i, where in enumerate(("under a file", "read-only", "full")):
        (tmp / str(i)).mkdir()
        with _disks(tmp / str(i)) as disk:
            t(disk, tmp / str(i), where)
    return "one line naming the project home (EMBODIED_R_HOME) and the fix, exit 2", OK_ERROR


@case("finished home on a read-only mount, then writable again")
def _home_read_only(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_disk import test_a_home_with_finished_work_on_a_read_only_mount_is_named_and_kept as t

    t(tmp)
    return "one line naming the home (EMBODIED_R_HOME, --home), the folder and the fix; rerun: cached", RECOVERED


@case("home read-only mid perception (after its 5th item), rerun")
def _home_read_only_mid_run(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_disk import (
        test_a_home_that_becomes_read_only_mid_stage_fails_it_once_and_the_rerun_resumes as t)

    t(tmp)
    return ("failed once (not retried), one line naming the home, the folder, the fix and the .partial kept; "
            "store lost once; rerun resumed from the kept items"), RECOVERED


@case("home marker damaged")
def _home_marker(tmp: Path) -> tuple[str, str]:
    from benchmarks.fault_sentences import _run
    from tests.faults.test_fault_disk import test_a_damaged_home_marker_is_named_with_both_fixes as t

    _run(t, tmp)
    return "one line: delete it if made here, or write its path and relocate", OK_ERROR


@case("stage retries: full disk, refused input, config error")
def _retries(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_disk import test_only_a_failure_that_may_pass_is_retried as t

    t()
    return "not retried (errors.may_pass); a crashed trainer or a reset connection is", OK_ERROR


@case("catalog row whose video path leaves its benchmark")
def _outside(tmp: Path) -> tuple[str, str]:
    from tests.data.test_download_catalog import test_a_row_whose_video_path_leaves_its_benchmark_is_refused_not_missing as t

    for i, escape in enumerate(("../../../outside.mp4", "/abs/outside.mp4")):
        (tmp / str(i)).mkdir()
        t(tmp / str(i), escape)
    return "left out as path_outside_benchmark, with the fix", OK_ERROR


@case("corrupt videos (no moov atom): key frames, then perception")
def _corrupt(tmp: Path) -> tuple[str, str]:
    from tests.perception.test_perception_failure import (
        test_perception_stopped_by_videos_without_key_frames_names_them_and_their_list as t)

    class _Unchecked:  # the terminal's silence is the test's to check (pytest's capfd), not this table's
        def readouterr(self) -> object:
            return type("Out", (), {"out": "", "err": ""})()

    t(tmp, _Unchecked())
    return ("FFmpeg's words attached to each video in failures.parquet; perception names both videos and that "
            "file"), OK_ERROR
