"""Nothing outlives a killed CLI: a watcher in a session of its own notes the CLI's descendants
every second and, once the CLI is gone, ends those still alive, by pid and start time so that a
reused pid is never hit. Prefect's ephemeral server, above all, cannot watch its parent itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 1.0
GRACE_S = 3.0


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of ``pid``, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[19]


def descendants(root: int) -> dict[int, str]:
    """pid -> start time."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _stat(int(entry))
            if info is not None:
                children.setdefault(info[0], []).append((int(entry), info[1]))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            if pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def _still(pid: int, start: str) -> bool:
    info = _stat(pid)
    return info is not None and info[1] == start


def running(pid: int, start: str) -> bool:
    """A zombie, dead and waiting for a parent to reap it, does not run."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and _still(pid, start)


def watch(target: int) -> None:
    me = os.getpid()
    target_start = (_stat(target) or (0, ""))[1]
    seen: dict[int, str] = {}
    while _still(target, target_start):
        seen.update({p: s for p, s in descendants(target).items() if p != me})
        time.sleep(POLL_S)
    left = {p: s for p, s in seen.items() if _still(p, s)}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, start in left.items():
            if _still(pid, start):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        deadline = time.time() + GRACE_S
        while time.time() < deadline and any(_still(p, s) for p, s in left.items()):
            time.sleep(0.1)


def start_reaper() -> subprocess.Popen | None:
    """Linux only; elsewhere children watch themselves."""
    if not Path("/proc/self/stat").exists() or os.environ.get("EMBODIED_R_NO_REAPER"):
        return None
    return subprocess.Popen([sys.executable, "-m", "embodied_r.apps.reaper", str(os.getpid())],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
