"""The rehearsal's items that launch the trainer in other shapes than the pipeline's: colocated
rollouts with planted sync faults, Embodied-Reasoner's SFT under ZeRO-3, two nodes, the pool."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from embodied_r.checks.rehearse_verdicts import ONE_STAGE, RECIPE, TWO_NODES, Failed, free_port, last_error
from embodied_r.training.environment import PROJECT_ROOT

if TYPE_CHECKING:  # the orchestrator hands itself in
    from embodied_r.checks.rehearse_run import Rehearsal


def peer_sft(r: Rehearsal) -> str:
    """Embodied-Reasoner's first SFT stage as its GPU recipe runs it, on 2 processes."""
    sets = ["--set", "sft.launcher=accelerate", "--set", "sft.accelerate_config=infra/training/accelerate-zero3-rehearsal.yaml",
            "--set", "sft.use_cpu=false", "--set", "sft.bf16=false", "--set", "sft.max_steps=2",
            "--set", "sft.save_steps=1", "--set", "data.synthetic_train=30", "--set", "data.synthetic_test=11"]
    _, seconds = r.cli("peer-sft", "reasoner", "--recipe", "reasoner-demo", "--only", "data", "sft_imitation", *sets)
    summary = r.summary("reasoner_sft_imitation")
    if summary.get("processes") != 2 or summary.get("steps") != 2:
        raise Failed(f"peer SFT: {summary.get('steps')} steps on {summary.get('processes')} processes")
    return (f"Embodied-Reasoner's imitation SFT, tiny Qwen2.5-VL with the PIL image processor, ZeRO-3 on "
            f"2 processes: {summary['steps']} steps, model saved, {seconds:.0f} s")


def two_nodes(r: Rehearsal) -> str:
    """As docs/running.md tells a user with two machines: node 1's follower first, then the main
    node's `train`, both on 127.0.0.1."""
    env = dict(r.env, EMBODIED_R_BASE_PYTHON=r.python)
    follow = subprocess.Popen(["bash", "infra/training/launch-multinode.sh", "follow", "1", "--once"],
                              cwd=PROJECT_ROOT, env=env, stdout=open(r.logs / "node-1.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        time.sleep(3)  # the follower notes what exists before it watches for new launches
        main_env = dict(env, EMBODIED_R_MAIN_ADDR="127.0.0.1")
        _, seconds = r.run("node-0", ["bash", "infra/training/launch-multinode.sh", "main", "train",
                                      "--recipe", RECIPE, *r.sets,
                                      "--set", f"training.accelerate_config={TWO_NODES}",
                                      "--set", f"training.stages={ONE_STAGE % 'nodes'}",
                                      "--set", "training.max_steps_per_stage=1"], env=main_env)
        rc = follow.wait(timeout=120)
    finally:
        if follow.poll() is None:
            os.killpg(follow.pid, signal.SIGKILL)
    summary = r.summary("train_nodes")
    if rc != 0 or summary.get("processes") != 2:
        raise Failed(f"node 1 exited {rc}; the stage trained in {summary.get('processes')} processes")
    return (f"stage `nodes` across 2 nodes (1 process each, one launcher per node meeting at 127.0.0.1): "
            f"{summary['steps']} steps, {summary.get('vllm_sync_checks')} syncs checked, {seconds:.0f} s")


def pool(r: Rehearsal) -> str:
    """A train stage sent to the gpu-train pool as docs/running.md does it; its trainer must run
    with the rehearsal environment's interpreter."""
    base_bin = Path(r.base_python).parent
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    server_env = dict(r.env, PATH=f"{base_bin}{os.pathsep}{os.environ.get('PATH', '')}",
                      PREFECT_PORT=str(port), PREFECT_API_URL=api, PREFECT_HOME=str(r.work / "prefect-server"))
    server = subprocess.Popen(["bash", "infra/start-prefect.sh"], cwd=PROJECT_ROOT, env=server_env,
                              stdout=open(r.logs / "prefect-server.log", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    worker = None
    try:
        r.run("deploy", ["bash", "infra/deploy.sh", "--recipe", RECIPE, "--wait", "180"], env=server_env)
        worker_env = dict(r.env, PREFECT_API_URL=api, EMBODIED_R_TRAIN_VENV=str(Path(r.python).parents[1]),
                          PREFECT_HOME=str(r.work / "prefect-worker"))
        worker = subprocess.Popen(["bash", "infra/start-worker.sh", "gpu-train", "--run-once"], cwd=PROJECT_ROOT,
                                  env=worker_env, stdout=open(r.logs / "worker-gpu-train.log", "w"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        overrides = {"training.stages": json.loads(ONE_STAGE % "pool"), "training.max_steps_per_stage": 1,
                     "training.reference.base_url": f"http://127.0.0.1:{r.port}/v1"}
        _, seconds = r.run("pool-run", [str(base_bin / "prefect"), "deployment", "run", "embodied-r-train/train",
                                        "--param", f"recipe={RECIPE}", "--param",
                                        f"overrides={json.dumps(overrides)}", "--watch"], env=server_env)
        worker.wait(timeout=120)
    finally:
        for proc in (worker, server):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
    summary = r.summary("train_pool")
    launch = next(line for line in (r.stage_dir("train_pool") / "train.log").read_text().splitlines()
                  if line.startswith("$ "))
    if not launch.startswith(f"$ {r.python} "):
        raise Failed(f"the pool's trainer ran with another interpreter: {launch[:160]}")
    left = r.leftovers(f":{port}", "--pool gpu-train")
    if left:
        raise Failed(f"still running after the pool's stop: {left}")
    return (f"train stage sent to the gpu-train pool of a Prefect server, its worker (start-worker.sh) and "
            f"trainer in this environment: {summary['steps']} steps on {summary['processes']} processes, "
            f"{seconds:.0f} s for the flow run")


def colocate(r: Rehearsal) -> str:
    """The pipeline's stage 1 is the clean run; one process then trains it with each planted
    fault of the sync, which must stop it."""
    from embodied_r.config import load_recipe
    from embodied_r.training.stage import run_training_stage

    clean = r.summary("train_stage1")
    recipe = load_recipe(RECIPE, {"training": {"launcher": "python", "accelerate_config": None,
                                               "completions_per_step": 4, "max_steps_per_stage": 3}})
    cfg, stage = recipe.training, recipe.training.stages[0]
    if clean.get("vllm_sync_checks") != clean.get("steps") or clean["vllm_sync_max_gap"] > cfg.vllm.sync_tolerance:
        raise Failed(f"stage 1: {clean.get('vllm_sync_checks')} checks over {clean.get('steps')} steps, "
                     f"largest gap {clean.get('vllm_sync_max_gap')}")
    records, plants = r.stage_dir("convert"), r.plants()
    os.environ.update(r.env)
    caught = []
    for plant in ("skip-sync", "stale-head"):
        os.environ["EMBODIED_R_REHEARSAL_PLANT"] = plant
        os.environ["PYTHONPATH"] = os.pathsep.join((str(plants), r.env["PYTHONPATH"]))
        out = r.work / "colocate" / plant
        log = out.with_name(out.name + ".partial") / "train.log"
        started = time.monotonic()
        try:
            run_training_stage(records, cfg.policy, out, stage, cfg)
        except RuntimeError:
            text = log.read_text(errors="replace")
            if "SyncMismatch" not in text:
                raise Failed(f"planted {plant}: the stage failed, but not on the sync check: {last_error(log)}")
            gap = text.split("differ by up to ")[1].split()[0]
            at = text.split("after the sync at step ")[1].split(":")[0]
            caught.append(f"{plant} stopped at the sync of step {at} (gap {gap}, {time.monotonic() - started:.0f} s)")
        else:
            raise Failed(f"planted {plant}: the stage trained to the end; the sync check missed it")
        finally:
            os.environ.pop("EMBODIED_R_REHEARSAL_PLANT", None)
            os.environ["PYTHONPATH"] = r.env["PYTHONPATH"]
    return (f"stage 1 (2 processes): {clean['steps']} syncs checked, largest log-prob gap "
            f"{clean['vllm_sync_max_gap']:.1e} <= {cfg.vllm.sync_tolerance:g}; planted, 1 process: {'; '.join(caught)}")
