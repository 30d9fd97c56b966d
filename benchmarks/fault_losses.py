"""Things lost under a run, for ``benchmarks/faults.py``: a tracking server that does not
answer or dies mid-run, and a finished stage folder that lost a file.

The killed-server case runs the smoke recipe (one GRPO stage) against a real ``mlflow
server`` killed (kill -9) while perception works, then reruns it with the server back; the
lost-file case reuses that home, whose every stage is then finished (``_Lost``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.fault_inputs import cli
from benchmarks.fault_kills import OK_ERROR, RECOVERED, case


class _Lost:
    run: dict[str, Any] | None = None


def _stage_events(text: str, event: str) -> list[str]:
    return [t.split()[1] for t in text.splitlines() if t.startswith("[stage]") and f" {event} " in t + " "]


@case("tracking: server port closed (validate, run)")
def _closed_port(tmp: Path) -> tuple[str, str]:
    from tests.servers import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    validate = cli(["validate", "--recipe", "smoke"], tmp / "home", timeout=120, MLFLOW_TRACKING_URI=uri)
    run = cli(["run", "--recipe", "smoke"], tmp / "home", timeout=600, MLFLOW_TRACKING_URI=uri)
    took = time.monotonic() - started
    lines = [r.stderr.strip() for r in (validate, run)]
    ok = (validate.returncode == run.returncode == 2 and lines[0] == lines[1] and "\n" not in lines[0]
          and all(n in lines[0] for n in (uri, "infra/start-mlflow.sh", "MLFLOW_TRACKING_URI"))
          and not (tmp / "home" / "stages").exists())
    return f"both refused in {took:.1f} s: {lines[1][:110]}...", OK_ERROR if ok else "FAIL"


@case("tracking: server killed (kill -9) mid-run, rerun with it back")
def _killed_server(tmp: Path) -> tuple[str, str]:
    from tests.faults.test_fault_losses import killed_mid_run, planned, rerun_with_server_back

    lost = _Lost.run = killed_mid_run(tmp)
    stages = planned(lost["home"])
    said = [t for t in lost["stdout"].splitlines() if "tracking lost" in t]
    first_ok = (lost["rc"] == 1 and "\n" not in lost["stderr"].strip() and len(said) == 1
                and all(sp.complete for sp in stages.values()))
    again, parents, children = rerun_with_server_back(lost)
    redone = _stage_events(again.stdout, "started")
    logged = sorted(c.data.tags["stage"] for c in children if c.info.status == "FINISHED")
    ok = first_ok and again.returncode == 0 and not redone and logged == sorted(stages)
    return (f"run went on untracked, exit {lost['rc']}: \"{lost['stderr'].strip()[:70]}...\"; rerun redid "
            f"{len(redone)} stages, logged {len(logged)} of {len(stages)}"), RECOVERED if ok else "FAIL"


@case("finished folder lost a file (truncated, then one removed)")
def _lost_file(tmp: Path) -> tuple[str, str]:
    import pyarrow.parquet as pq

    from tests.faults.test_fault_losses import ONE_STAGE, killed_mid_run, planned

    lost = _Lost.run or killed_mid_run(tmp)
    home = lost["home"]
    convert = Path(planned(home)["convert"].out)
    data = (convert / "test.parquet").read_bytes()
    (convert / "test.parquet").write_bytes(data[: len(data) // 2])
    stopped = cli(["run", "--recipe", "smoke", *ONE_STAGE], home)
    line = stopped.stderr.strip()
    (convert / "train.parquet").unlink()
    refreshed = cli(["run", "--recipe", "smoke", *ONE_STAGE, "--refresh", "train_stage1"], home)
    ran = _stage_events(refreshed.stdout, "started")
    ok = (stopped.returncode == 1 and "\n" not in line and "--refresh convert" in line
          and refreshed.returncode == 0 and ran == ["convert", "train_stage1", "evaluate"]
          and pq.read_table(convert / "train.parquet").num_rows > 0)
    return (f"run stopped: \"{line[:60]}...\"; --refresh train_stage1 redid convert once, then "
            f"{', '.join(ran[1:])}"), OK_ERROR if ok else "FAIL"
