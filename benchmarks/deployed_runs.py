"""The deployed `embodied-r/full-pipeline` run N times on a finished home against real Prefect and
MLflow servers and a worker per pool (docs/running.md), its failures counted by cause.

    python benchmarks/deployed_runs.py --runs 30 --restart first --home /tmp/deployed-home
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.servers import free_port, wait_http  # noqa: E402

BIN = Path(sys.executable).parent
POOLS = ("cpu", "gpu-infer", "gpu-train")
DEPLOYMENT = "embodied-r/full-pipeline"
# The last line of a traceback: the exception that ended the run.
RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exit|Interrupt|Failed))\b:?\s*(.*)$")


class Stack:
    """Processes started in their own groups, stopped group by group."""

    def __init__(self, logs: Path, env: dict[str, str], checkout: Path):
        self.logs, self.env, self.checkout = logs, env, checkout
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, script: str, *args: str, from_a_script: bool = False) -> subprocess.Popen:
        ignore_sigint = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if from_a_script else None
        with open(self.logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(["bash", str(self.checkout / "infra" / script), *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=self.env, cwd=self.checkout,
                                    start_new_session=True, preexec_fn=ignore_sigint)
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGTERM, wait_s: float = 30) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)


def _prefect(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "prefect"), *args], env=env, cwd=env["EMBODIED_R_CHECKOUT"],
                          capture_output=True, text=True, timeout=timeout)


def _final_state(run_id: str, timeout: float) -> tuple[str, str]:
    """(state type, state message) once the flow run is final, read from the API."""
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            state = client.read_flow_run(run_id).state
            if state is not None and state.is_final() or time.monotonic() > deadline:
                return (state.type.value if state else "NONE"), (state.message or "" if state else "")
            time.sleep(2)


def _cause(run_id: str, message: str) -> str:
    """The exception that ended a run, digits and paths blanked so one cause counts once: the
    last line of the last traceback in its logs, else its state's message."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])), limit=200)
    raised = [m.group(1) + ": " + m.group(2) for log in logs for line in log.message.splitlines()
              if (m := RAISED.match(line.strip()))]
    text = raised[-1] if raised else message.strip().splitlines()[0] if message.strip() else "no message"
    return re.sub(r"\d+", "N", re.sub(r"/\S+", "PATH", text))[:160]


def one_run(env: dict[str, str], recipe: str, timeout: float) -> dict:
    started = time.monotonic()
    done = _prefect(env, "deployment", "run", DEPLOYMENT, "--param", f"recipe={recipe}", "--watch",
                    timeout=timeout)
    out = done.stdout + done.stderr
    found = re.search(r"UUID:\s*([0-9a-f-]{36})", out)
    if found is None:
        return {"state": "NOT STARTED", "cause": out.strip().splitlines()[-1][:160] if out.strip() else "",
                "seconds": round(time.monotonic() - started, 1)}
    run_id = found.group(1)
    state, message = _final_state(run_id, timeout)
    row = {"flow_run": run_id, "state": state, "seconds": round(time.monotonic() - started, 1),
           "watch_stopped_early": "before it reached a terminal state" in out}
    if state != "COMPLETED":
        row["cause"] = _cause(run_id, message)
    return row


def restart_server(stack: Stack, api: str, down_s: float) -> float:
    """The Prefect server killed (kill -9, its whole group) and started again ``down_s`` later;
    the workers keep running. Returns the seconds it took to answer again."""
    stack.kill("prefect-server", signal.SIGKILL)
    time.sleep(down_s)
    started = time.monotonic()
    stack.start("prefect-server", "start-prefect.sh")
    wait_http(f"{api}/health", 180, stack.procs["prefect-server"], stack.logs / "prefect-server.log")
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--recipe", default="smoke")
    ap.add_argument("--home", type=Path, help="the project home (kept; finished by a first run when it is not)")
    ap.add_argument("--checkout", type=Path, default=REPO, help="the checkout to deploy and run (default this one)")
    ap.add_argument("--restart", choices=("none", "first", "each"), default="none",
                    help="kill -9 the Prefect server and start it again before the first run, or before each")
    ap.add_argument("--down", type=float, default=45.0, help="seconds the server stays down at a restart")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    ap.add_argument("--workdir", type=Path, help="servers' state and logs (default a new temporary folder)")
    ap.add_argument("--out", type=Path, help="write every run and the counts as JSON here")
    args = ap.parse_args(argv)

    checkout = args.checkout.resolve()
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="deployed-runs-"))).resolve()
    home = (args.home or work / "home").resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    prefect_port, mlflow_port = free_port(), free_port()
    api, uri = f"http://127.0.0.1:{prefect_port}/api", f"http://127.0.0.1:{mlflow_port}"
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "2", "EMBODIED_R_HOME": str(home), "EMBODIED_R_CHECKOUT": str(checkout),
           "PATH": f"{BIN}:{os.environ['PATH']}", "PREFECT_PORT": str(prefect_port), "MLFLOW_PORT": str(mlflow_port),
           "PREFECT_API_URL": api, "MLFLOW_TRACKING_URI": uri,
           # The deployed checkout's code, whichever the environment was installed from.
           "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
    env.pop("PREFECT_API_KEY", None)
    os.environ.update({k: env[k] for k in ("PREFECT_HOME", "PREFECT_API_URL")})
    print(f"checkout {checkout}, home {home}, logs {work / 'logs'}", flush=True)

    stack = Stack(work / "logs", env, checkout)
    rows: list[dict] = []
    try:
        stack.start("prefect-server", "start-prefect.sh")
        stack.start("mlflow-server", "start-mlflow.sh")
        wait_http(f"{uri}/health", 180, stack.procs["mlflow-server"], work / "logs" / "mlflow-server.log")
        deployed = subprocess.run(["bash", str(checkout / "infra" / "deploy.sh"), "--recipe", args.recipe],
                                  env=env, cwd=checkout, capture_output=True, text=True, timeout=600)
        if deployed.returncode != 0:
            print(deployed.stdout[-2000:], deployed.stderr[-2000:], file=sys.stderr)
            return 1
        for pool in POOLS:
            stack.start(f"worker-{pool}", "start-worker.sh", pool, from_a_script=True)

        plan = subprocess.run([str(BIN / "embodied-r"), "plan", "--recipe", args.recipe], env=env, cwd=checkout,
                              capture_output=True, text=True, timeout=300)
        if " to do " in plan.stdout:
            print("finishing the home with one deployed run first", flush=True)
            first = one_run(env, args.recipe, args.timeout)
            print(f"  {first}", flush=True)
            if first["state"] != "COMPLETED":
                return 1

        for i in range(args.runs):
            restarted = None
            if args.restart == "each" or (args.restart == "first" and i == 0):
                restarted = round(restart_server(stack, api, args.down), 1)
            row = {"run": i + 1, **one_run(env, args.recipe, args.timeout)}
            if restarted is not None:
                row["server_back_after_s"] = restarted
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        stack.stop()

    causes = Counter(r.get("cause", "completed") for r in rows)
    seconds = sorted(r["seconds"] for r in rows)
    summary = {"runs": len(rows), "failed": sum(r["state"] != "COMPLETED" for r in rows), "causes": dict(causes),
               "median_s": seconds[len(seconds) // 2] if seconds else None,
               "max_s": seconds[-1] if seconds else None, "restart": args.restart, "checkout": str(checkout)}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
