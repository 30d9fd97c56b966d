"""The rehearsal's environment, processes and logs, and the items that follow one pipeline run:
the served reference, perception, the ZeRO-3 stages with a killed rank, and evaluation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from embodied_r.checks.rehearse_verdicts import (PLANT, RECIPE, REFERENCE_NAME, Failed, agreement, checkpoint_figures,
                                                 free_port, last_error, predictions, zero3_problems)
from embodied_r.training.environment import PROJECT_ROOT


class Rehearsal:
    def __init__(self, work: Path, base_python: str, plant: str | None = None):
        self.plant = plant
        self.work = work
        self.home = work / "home"
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.python = sys.executable
        self.base_python = base_python
        self.port = free_port()
        self.env = dict(
            os.environ, EMBODIED_R_HOME=str(self.home), PREFECT_HOME=str(work / "prefect"),
            PYTHONPATH=os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p),
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
            PREFECT_SERVER_ANALYTICS_ENABLED="false", VLLM_LOGGING_LEVEL="WARNING",
            EMBODIED_R_REHEARSAL_KEY="not-a-secret")
        for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "EMBODIED_R_TRAIN_PYTHON"):
            self.env.pop(name, None)
        self.sets = ["--set", f"training.reference.base_url=http://127.0.0.1:{self.port}/v1",
                     "--set", f"evaluation.consistency_judge.base_url=http://127.0.0.1:{self.port}/v1"]
        self.reference_pid: int | None = None
        self.facts: dict[str, Any] = {}

    def run(self, name: str, cmd: list[str], env: dict[str, str] | None = None, timeout: float = 900,
            check: bool = True) -> tuple[int, float]:
        """``cmd`` from the checkout, its output in ``logs/NAME.log``; (exit code, seconds)."""
        log = self.logs / f"{name}.log"
        started = time.monotonic()
        with open(log, "a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env or self.env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                raise Failed(f"{' '.join(cmd[:4])} ... ran past {timeout:.0f} s; see {log}")
        seconds = time.monotonic() - started
        if check and rc != 0:
            raise Failed(f"`{' '.join(cmd[2:6])} ...` exited {rc}: {last_error(log)} (see {log})")
        return rc, seconds

    def cli(self, name: str, *args: str, check: bool = True, env: dict[str, str] | None = None) -> tuple[int, float]:
        return self.run(name, [self.python, "-m", "embodied_r.apps.cli", *args], env=env, check=check)

    def stage_dir(self, name: str) -> Path:
        """A stage's newest finished folder in this home."""
        found = sorted((p for p in (self.home / "stages" / name).glob("*") if not p.name.endswith(".partial")),
                       key=lambda p: p.stat().st_mtime)
        if not found:
            raise Failed(f"no finished {name} stage under {self.home / 'stages'}")
        return found[-1]

    def summary(self, name: str) -> dict[str, Any]:
        return json.loads((self.stage_dir(name) / "summary.json").read_text())

    def leftovers(self, *marks: str, grace_s: float = 20.0) -> list[str]:
        """Processes, the reference server's aside, still running ``grace_s`` after a command
        ended whose environment names this home (every child inherits it) or whose command line
        holds one of ``marks``. The grace: a watcher such as ``apps.reaper`` polls."""
        deadline = time.monotonic() + grace_s
        while True:
            found = self._running(marks)
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(1)

    def _running(self, marks: tuple[str, ...]) -> list[str]:
        import psutil

        keep = {os.getpid()}
        if self.reference_pid is not None and psutil.pid_exists(self.reference_pid):
            server = psutil.Process(self.reference_pid)
            keep |= {server.pid, *(c.pid for c in server.children(recursive=True))}
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "environ", "status"]):
            line = " ".join(proc.info["cmdline"] or [])
            ours = (proc.info["environ"] or {}).get("EMBODIED_R_HOME") == str(self.home)
            if proc.info["pid"] not in keep and proc.info["status"] != psutil.STATUS_ZOMBIE and \
                    (ours or any(m in line for m in marks)):
                found.append(f"{proc.info['pid']}: {line[:120]}")
        return found

    def start_reference(self) -> str:
        from embodied_r.backends.models import resolve_model

        os.environ.update({k: self.env[k] for k in ("EMBODIED_R_HOME", "HF_HUB_OFFLINE")})
        model = resolve_model("tiny:lm-vllm")
        env = dict(self.env, REFERENCE_MODEL=model, REFERENCE_NAME=REFERENCE_NAME, REFERENCE_PORT=str(self.port),
                   REFERENCE_MEMORY="0.1", REFERENCE_GPU="0", REFERENCE_MAX_LEN="4096", REFERENCE_WAIT_S="300",
                   REFERENCE_LOG=str(self.logs / "reference-server.log"))
        _, seconds = self.run("serve-reference", ["bash", "infra/training/serve-reference.sh", "--detach"], env=env)
        text = (self.logs / "serve-reference.log").read_text()
        self.reference_pid = int(text.split("reference server pid ")[1].split()[0])
        self.facts["reference_start_s"] = seconds
        return f"up in {seconds:.0f} s, {self.ask_served_reference()}"

    def ask_served_reference(self) -> str:
        """The served reference asked by the consistency reward and by the evaluation's judge: a
        random tiny policy seldom writes a correct answer in format, so training would never ask it."""
        from embodied_r.backends.factory import make_backend
        from embodied_r.checks.steps import ask_reference
        from embodied_r.config import load_recipe, parse_overrides
        from embodied_r.scoring.rewards import consistency_ratio

        recipe = load_recipe(RECIPE, parse_overrides(self.sets[1::2]))
        asked = ask_reference(recipe.training.reference)
        if asked["problems"]:
            raise Failed(f"the consistency reward over the served reference: {'; '.join(asked['problems'])}")
        judge = make_backend(recipe.evaluation.consistency_judge)
        try:
            started = time.monotonic()
            _, verdicts = consistency_ratio(
                judge, ["<think>I moved forward; the bridge stays ahead.</think><answer>C</answer>"] * 4,
                ["Which direction is the bridge?"] * 4, ["choice"] * 4, [["A. left", "B. right", "C. ahead", "D. behind"]] * 4)
            judged_s = time.monotonic() - started
        finally:
            judge.close()
        if any(v is None for v in verdicts):
            raise Failed(f"the judge over the served reference gave no verdict: {verdicts}")
        return (f"the consistency reward asked it {asked['asked']:.0f} time(s) and scored the answer, the judge "
                f"gave {len(verdicts)} verdicts in {judged_s:.1f} s")

    def stop_reference(self) -> str:
        import psutil

        if self.reference_pid is None:
            raise Failed("the reference server was never started")
        server = psutil.Process(self.reference_pid)
        family = [server] + server.children(recursive=True)
        server.terminate()  # SIGTERM, as docs/running.md stops servers
        gone, alive = psutil.wait_procs(family, timeout=60)
        left = self.leftovers(f"--port {self.port}") + [f"{p.pid}" for p in alive]
        if left:
            raise Failed(f"still running after the reference server's stop: {left}")
        return f"stopped ({len(gone)} processes) with nothing left running"

    def pipeline(self) -> tuple[str, str, str]:
        """The whole pipeline with one trainer rank killed in stage 2 after its first checkpoint,
        where the stage's retry resumes; the perception, ZeRO-3 and evaluation lines."""
        cmd = [self.python, "-m", "embodied_r.apps.cli", "run", "--recipe", RECIPE, *self.sets]
        log = self.logs / "pipeline.log"
        env = dict(self.env)
        if self.plant:
            env.update(EMBODIED_R_REHEARSAL_PLANT=self.plant,
                       PYTHONPATH=os.pathsep.join((str(self.plants()), self.env["PYTHONPATH"])))
        started = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                checkpoint, killed_at = self.kill_rank_after_checkpoint("train_stage2", 2, proc)
                # Read at once: the retry resumes from it and drops it when the stage ends.
                self.facts["resume"] = checkpoint_figures(checkpoint)
                rc = proc.wait(timeout=900)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        seconds = time.monotonic() - started
        if rc != 0:
            raise Failed(f"the pipeline did not finish after the kill (exit {rc}): {last_error(log)} (see {log})")
        left = self.leftovers()
        if left:
            raise Failed(f"after the pipeline, still running: {left}")
        events = [line.split()[1:3] for line in log.read_text(errors="replace").splitlines()
                  if line.startswith("[stage]")]
        if ["train_stage2", "failed"] not in events or events.count(["train_stage1", "started"]) != 1:
            raise Failed(f"expected stage 2 to fail once and stage 1 to run once: {events}")
        finished_before = [name for name in ("perception", "train_stage1")
                           if (self.stage_dir(name) / "summary.json").stat().st_mtime > killed_at]
        if finished_before:
            raise Failed(f"rewritten after the kill although finished before it: {finished_before}")
        return self.perception_line(), self.zero3_line(seconds), self.evaluate_line()

    def plants(self) -> Path:
        folder = self.work / "plants"
        folder.mkdir(exist_ok=True)
        (folder / "sitecustomize.py").write_text(PLANT)
        return folder

    def kill_rank_after_checkpoint(self, stage: str, step: int, proc: subprocess.Popen) -> tuple[Path, float]:
        """SIGKILL trainer rank 1 once ``checkpoint-STEP`` is whole; the checkpoint and the time."""
        import psutil

        from embodied_r.training.checkpoints import checkpoint_is_whole

        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise Failed(f"the pipeline ended (exit {proc.returncode}) before {stage} saved checkpoint-{step}: "
                             f"{last_error(self.logs / 'pipeline.log')}")
            for checkpoint in (self.home / "stages" / stage).glob(f"*.partial/checkpoints/checkpoint-{step}"):
                if checkpoint_is_whole(checkpoint) and list(checkpoint.glob("global_step*")):
                    spec = str(checkpoint.parents[1] / "spec.json")
                    ranks = [p for p in psutil.process_iter(["pid", "cmdline", "environ"])
                             if spec in " ".join(p.info["cmdline"] or [])
                             and "accelerate.commands.launch" not in " ".join(p.info["cmdline"] or [])
                             and (p.info["environ"] or {}).get("LOCAL_RANK") == "1"]
                    if ranks:
                        ranks[0].send_signal(signal.SIGKILL)
                        self.facts["killed_after_step"] = step
                        return checkpoint, time.time()
            time.sleep(0.2)
        raise Failed(f"{stage} saved no whole checkpoint-{step} within 600 s")

    def perception_line(self) -> str:
        import pyarrow.parquet as pq

        from embodied_r import schemas

        folder = self.stage_dir("perception")
        summary = json.loads((folder / "summary.json").read_text())
        schema = pq.read_schema(folder / "perception.parquet")
        frames = pq.read_schema(folder / "perception_frames.parquet")
        wrong = [n for s, want in ((schema, schemas.PERCEPTION), (frames, schemas.PERCEPTION_FRAMES))
                 for n in want.names if n not in s.names or s.field(n).type != want.field(n).type]
        if wrong or summary.get("failed") or not summary.get("done"):
            raise Failed(f"perception: columns {wrong} off the schema, {summary.get('failed')} failed")
        seconds = next(line.split()[3] for line in (self.logs / "pipeline.log").read_text(errors="replace").splitlines()
                       if line.startswith("[stage] perception") and " done " in line)
        return (f"{summary['done']} questions, {summary['calls_made']} vLLM calls ({summary['calls_failed']} failed) "
                f"in {seconds} s, engine start included; perception.parquet and perception_frames.parquet in the "
                "schema every backend writes")

    def zero3_line(self, seconds: float) -> str:
        stages = [self.summary(f"train_{s}") for s in ("stage1", "stage2", "stage3")]
        step, resumed = self.facts["killed_after_step"], self.facts["resume"]
        problems = zero3_problems(stages, step, resumed)
        if problems:
            raise Failed("; ".join(problems))
        second = stages[1]
        gaps = max(s["vllm_sync_max_gap"] for s in stages)
        return (f"3 stages x 2 processes, {sum(s['vllm_sync_checks'] for s in stages)} weight syncs checked "
                f"(largest log-prob gap {gaps:.1e} <= {stages[0]['vllm_sync_tolerance']:g}); rank 1 killed "
                f"after checkpoint-{step} of stage 2, its retry resumed at step {second['resumed_from_step']} with "
                f"Adam's step {second['first_adam_step']} and lr {second['first_learning_rate']:.3g} restored; "
                f"stage3 carried on at Adam's step {stages[2]['first_adam_step']}, lr {stages[2]['first_learning_rate']:.3g}; "
                f"nothing finished before the kill recomputed; pipeline {seconds:.0f} s")

    def evaluate_line(self) -> str:
        summary = self.summary("evaluate")
        model = str(self.stage_dir("train_stage3") / "model")
        # The pipeline's own evaluation is the vLLM fp32 run; the same weights again through
        # vLLM in bf16 and through the transformers backend, each timed by its own summary.
        runs = {"vllm-fp32": (predictions(self.stage_dir("evaluate")), summary["seconds"])}
        for name, sets in (("vllm-bf16", ["--set", "evaluation.backend.engine_kwargs.dtype=bfloat16"]),
                           ("transformers", ["--set", "evaluation.backend.kind=transformers",
                                             "--set", "evaluation.backend.device=cpu"])):
            out = self.work / "evaluations" / name
            self.cli(f"eval-{name}", "eval-model", model, "--recipe", RECIPE, "--split", "test", "--out", str(out),
                     "--no-track", "--set", "evaluation.consistency_judge=null", *sets)
            runs[name] = (predictions(out), json.loads((out / "summary.json").read_text())["seconds"])
        hf_rows, hf_s = runs["transformers"]
        figures = {name: (*agreement(runs[name][0], hf_rows), runs[name][1] / hf_s) for name in ("vllm-fp32", "vllm-bf16")}
        agree, text, ratio = figures["vllm-fp32"]
        bf_agree, bf_text, bf_ratio = figures["vllm-bf16"]
        line = (f"the pipeline's evaluation through vLLM in process ({summary['done']} test questions, "
                f"{summary['failed']} failed); greedy answers against transformers (fp32, same weights): vLLM fp32 {agree:.0%} same answer "
                f"({text:.0%} same text), vLLM bf16 {bf_agree:.0%} ({bf_text:.0%}); seconds vLLM/transformers "
                f"{ratio:.2f} (fp32), {bf_ratio:.2f} (bf16), engine start included")
        if text < 0.95:  # the stricter figure: a random policy's parsed answers are mostly empty
            raise Failed(line)
        return line
