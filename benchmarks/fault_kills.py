"""kill -9 of the demo at random moments, for ``benchmarks/faults.py``.

The demo runs once uninterrupted; the time each targeted part spends in its ``.partial``
folder is taken from that run. Then, in a fresh home, the CLI is killed once inside key
frames, once inside perception and once inside training (each at a moment drawn uniformly
over that part's duration), each kill followed by a rerun that goes on to the next part; the
home's last rerun finishes the demo, and its final outputs (key frames, perception, records,
trained weights) must equal the uninterrupted run's. Homes follow one another until N kills
are done. The first killed home trains its own tiny models; the others start from a copy of
the uninterrupted run's ``models`` folder, so that their time goes to the stages killed. Such
a home skips building its models, so its parts are timed again in a second uninterrupted run
that starts from the copied models, and the kills there draw over those.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
DEMO_DEADLINE_S = 1500
KILL_RECIPE = "demo"  # the kill cases run the demo, whose training changes weights
# Stage-name prefixes of the parts killed, in the order the demo reaches them.
TARGETS = ("keyframes", "perception", "train_")
OK_ERROR, RECOVERED = "clear error, nothing lost", "recovered"

# Every server and input case of the fault suite, registered where it is written
# (``@case(name)`` in faults.py, fault_inputs.py, fault_replies.py), run by faults.py.
Case = Callable[[Path], tuple[str, str]]
CASES: list[tuple[str, Case]] = []


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES.append((name, fn))
        return fn
    return register


def demo(home: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EMBODIED_R_HOME": str(home),
           "PREFECT_HOME": str(home / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    log = open(home / f"demo-{time.time_ns()}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "embodied_r.apps.cli", "run", "--recipe", KILL_RECIPE], stdout=log,
                            stderr=subprocess.STDOUT, env=env)


def partial(home: Path) -> list[str]:
    return sorted(p.parent.name for p in (home / "stages").glob("*/*.partial"))


def outputs(home: Path) -> dict[str, str]:
    """Digest of every final data output: key frames, perception, records, trained weights."""
    import pyarrow.parquet as pq

    out = {}
    for stage in sorted((home / "stages").iterdir()):
        for folder in stage.iterdir():
            if folder.suffix in (".partial", ".lock") or not (folder / "summary.json").is_file():
                continue
            for f in [*folder.glob("*.parquet"), *folder.glob("model/*.safetensors")]:
                if f.name == "failures.parquet" and stage.name != "perception":
                    continue
                if f.suffix == ".parquet":
                    table = pq.read_table(f)
                    # The catalog names each video by its absolute path, which holds the home.
                    data = table.drop_columns([c for c in ("video_path",) if c in table.column_names]) \
                        .to_pandas().to_json()
                else:
                    data = f.read_bytes().hex()
                out[f"{stage.name}/{f.relative_to(folder)}"] = hashlib.sha256(data.encode()).hexdigest()[:12]
    return out


def timed_demo(home: Path) -> tuple[int | None, float, dict[str, float]]:
    """The demo uninterrupted: return code, wall time, and seconds each target was partial."""
    started = time.monotonic()
    proc = demo(home)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    while proc.poll() is None and time.monotonic() - started < DEMO_DEADLINE_S:
        now = time.monotonic()
        for name in partial(home):
            for target in TARGETS:
                if name.startswith(target):
                    first.setdefault(target, now)
                    last[target] = now
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    return proc.returncode, time.monotonic() - started, {t: last[t] - first[t] + 0.1 for t in first}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_once(home: Path, target: str, seconds: float, rng: random.Random) -> tuple[str, str]:
    """Rerun the demo in ``home``, wait for ``target`` to start, kill -9 the CLI at a moment
    drawn over its duration; report what was partial and whether anything outlived it."""
    from embodied_r.apps.reaper import descendants

    proc = demo(home)
    deadline = time.monotonic() + DEMO_DEADLINE_S
    while proc.poll() is None and time.monotonic() < deadline and \
            not any(p.startswith(target) for p in partial(home)):
        time.sleep(0.05)
    delay = rng.uniform(0.0, 0.95 * seconds)
    until = time.monotonic() + delay
    while proc.poll() is None and time.monotonic() < until:
        time.sleep(0.05)
    if proc.poll() is not None:
        return (f"run ended (rc {proc.returncode}) before the kill at +{delay:.1f} s",
                RECOVERED if proc.returncode == 0 else "FAIL")
    at, kids = partial(home), descendants(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone_by = time.monotonic() + 20
    while time.monotonic() < gone_by and any(_alive(p) for p in kids):
        time.sleep(0.25)
    left = [p for p in kids if _alive(p)]
    for p in left:  # the script's own cleanup, so one finding does not spoil the next case
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return (f"at +{delay:.1f} s of ~{seconds:.0f} s; partial: {','.join(at) or '-'}; "
            f"{len(kids)} children, {len(left)} left after 20 s",
            OK_ERROR if not left else "FAIL: processes outlived the run")


def running_runs(home: Path) -> int:
    from mlflow import MlflowClient

    db = next(home.rglob("mlflow.db"), None)
    if db is None:
        return 0
    client = MlflowClient(f"sqlite:///{db}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(exps, filter_string="attributes.status = 'RUNNING'"))


def _timed_row(label: str, home: Path) -> tuple[tuple[str, str, str], dict[str, float]]:
    rc, wall, seconds = timed_demo(home)
    return ((label, f"rc {rc} in {wall:.0f} s; partial for "
             + ", ".join(f"{t.rstrip('_')} {s:.0f} s" for t, s in seconds.items()),
             RECOVERED if rc == 0 and set(seconds) == set(TARGETS) else "FAIL"), seconds)


def _final_row(label: str, home: Path, baseline: dict[str, str], rc: int | None) -> tuple[str, str, str]:
    final = outputs(home)
    differ = sorted(k for k in set(baseline) | set(final) if baseline.get(k) != final.get(k))
    running = running_runs(home)
    return (label, f"rc {rc}; {len(final)} outputs, {len(differ)} differ {differ[:4]}; "
            f"MLflow runs left RUNNING: {running}",
            RECOVERED if rc == 0 and not differ and running == 0 else "FAIL")


def kill_cases(tmp: Path, kills: int, seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    clean, warm = tmp / "clean", tmp / "warm"
    clean.mkdir(parents=True, exist_ok=True)
    row, cold_seconds = _timed_row("demo, uninterrupted", clean)
    rows = [row]
    if row[2] != RECOVERED:
        return rows
    baseline = outputs(clean)
    warm.mkdir(parents=True, exist_ok=True)
    shutil.copytree(clean / "models", warm / "models", dirs_exist_ok=True)
    row, warm_seconds = _timed_row("demo, uninterrupted, from the copied models", warm)
    rows += [row, _final_row("  its outputs against the first", warm, baseline, 0 if row[2] == RECOVERED else 1)]
    if row[2] != RECOVERED:
        return rows
    done, n_home = 0, 0
    while done < kills:
        home = tmp / f"killed{n_home}"
        home.mkdir(parents=True)
        seconds = cold_seconds
        if n_home:
            shutil.copytree(clean / "models", home / "models")
            seconds = warm_seconds
        n_home += 1
        for target in TARGETS[: kills - done]:
            done += 1
            outcome, verdict = kill_once(home, target, seconds[target], rng)
            rows.append((f"kill -9 #{done} in {target.rstrip('_')}", outcome, verdict))
        proc = demo(home)
        proc.wait(DEMO_DEADLINE_S)
        rows.append(_final_row(f"home {n_home}: rerun to the end", home, baseline, proc.returncode))
    return rows
