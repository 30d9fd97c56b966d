"""A real SIGKILL of a stage at a known point, and what a killed stage must not leave behind.

Most stages are a fast single pass, so a kill "after a while" lands at a different place on
every run, or after the end. Instead the child is told (``EMBODIED_R_STALL_AT``, see
``embodied_r.io.item_done``) to wait after its n-th item and to say so in a marker file;
only then is its whole process group sent SIGKILL. Where the kill lands is fixed; the kill is
real.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from embodied_r.io import STALL_ENV, STALL_MARKER_ENV, partial_path

ROOT = Path(__file__).resolve().parents[1]


def kill_at_item(code: str | list[str], stage: str, n: int, tmp: Path, env: dict[str, str] | None = None) -> None:
    """Run ``code`` (Python source, or a command line) in a child in its own process group;
    SIGKILL the group once the stage waits after its ``n``-th item. Fails when the child ends
    without getting there."""
    marker = tmp / f"stalled-{stage}-{n}"
    marker.unlink(missing_ok=True)
    errors = tmp / f"stderr-{stage}-{n}.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), STALL_ENV: f"{stage}:{n}", STALL_MARKER_ENV: str(marker),
           **(env or {})}
    with open(errors, "wb") as err:
        argv = [sys.executable, "-c", code] if isinstance(code, str) else code
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        while not marker.exists():
            # The stage cannot end on its own once it has reached item n: it waits there.
            assert proc.poll() is None, (f"{stage} ended (exit {proc.returncode}) before its item {n}:\n"
                                         + errors.read_text(errors="replace")[-3000:])
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL


def lock_is_free(final: Path) -> bool:
    """Whether nobody holds stage ``final``'s lock (the lock file itself stays: see ``io.stage_lock``)."""
    lock = final.with_name(final.name + ".lock")
    if not lock.exists():
        return True
    with open(lock, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


def files(folder: Path, volatile: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under ``folder`` by relative path; files named in ``volatile``
    (which hold timings) are left for the caller to compare."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in volatile}


def assert_clean_finish(final: Path) -> None:
    """A finished stage: no ``.partial`` folder, no temporary file, no lock held."""
    assert final.is_dir() and (final / "summary.json").is_file()
    assert not partial_path(final).exists()
    leftovers = [p.name for p in final.rglob("*") if p.name.endswith((".tmp", ".partial", ".wal"))]
    assert leftovers == []
    assert lock_is_free(final)



def write_checkpoints(base: Path, steps: tuple[int, ...] = (2, 4), optimizer: bool = False) -> Path:
    """Trainer checkpoints at ``steps`` under ``base``; returns the last one's folder."""
    import json

    import torch
    from safetensors.torch import save_file

    for step in steps:
        folder = base / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        save_file({"w": torch.zeros(64)}, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        if optimizer:
            torch.save({"x": torch.ones(3)}, folder / "optimizer.pt")
    return base / f"checkpoint-{steps[-1]}"


def cut_short(checkpoint: Path) -> None:
    """The checkpoint's weights as a kill during their save leaves them."""
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-40])
