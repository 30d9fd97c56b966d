"""Training on two nodes: the paper-16gpu recipe keeps the paper's batch, the launch takes
the main node's address from the environment, the other node joins each launch the main
node makes (infra/training/follow_launches.py), and on a shared filesystem only the global
rank 0 removes a checkpoint cut short. The launch itself is checked by the training
environment's check (infra/training/check-env.sh), which builds it for both nodes."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from embodied_r.config import load_recipe
from embodied_r.io import write_json_atomic
from embodied_r.settings import result_settings
from embodied_r.training.environment import LOG_NAME, PROJECT_ROOT, SPEC_NAME, launch_line, num_processes, \
    read_accelerate_config, resolve_config_file
from embodied_r.training.multinode import MAIN_ADDR_ENV
from tests.killing import cut_short, write_checkpoints


def _follow() -> Any:
    spec = importlib.util.spec_from_file_location("follow_launches",
                                                  PROJECT_ROOT / "infra/training/follow_launches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paper_16gpu_keeps_32_completions_per_step() -> None:
    sixteen, eight = load_recipe("paper-16gpu").training, load_recipe("paper-8gpu").training
    config = resolve_config_file(sixteen.accelerate_config)
    data = read_accelerate_config(config)
    assert (data["num_machines"], num_processes(config)) == (2, 16)
    assert data["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"
    assert (sixteen.accumulation_steps(16), eight.accumulation_steps(8)) == (2, 4)
    per_step = num_processes(config) * sixteen.per_device_train_batch_size * sixteen.accumulation_steps(16)
    assert per_step == 32 == 8 * eight.per_device_train_batch_size * eight.accumulation_steps(8)
    # Nothing else differs from the 8-GPU recipe: the same method on twice the GPUs.
    split = {"accelerate_config"}
    assert result_settings(sixteen, exclude=split) == result_settings(eight, exclude=split)


def test_the_launch_names_the_main_node_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    sixteen, eight = load_recipe("paper-16gpu").training, load_recipe("paper-8gpu").training
    monkeypatch.delenv(MAIN_ADDR_ENV, raising=False)
    with pytest.raises(ValueError, match=MAIN_ADDR_ENV) as info:
        sixteen.command("embodied_r.training.grpo", Path("/x/spec.json"))
    assert "\n" not in str(info.value) and "2 nodes" in str(info.value)
    monkeypatch.setenv(MAIN_ADDR_ENV, "10.1.2.3")
    cmd = sixteen.command("embodied_r.training.grpo", Path("/x/spec.json"))
    assert cmd[cmd.index("--main_process_ip") + 1] == "10.1.2.3"
    assert "--main_process_ip" not in eight.command("embodied_r.training.grpo", Path("/x/spec.json"))


def _launch(work: Path, cmd: list[str]) -> None:
    """What the train stage writes before its trainer starts (environment.run_child)."""
    work.mkdir(parents=True, exist_ok=True)
    write_json_atomic(work / SPEC_NAME, {"work": str(work)})
    with open(work / LOG_NAME, "a") as log:
        log.write(launch_line(cmd))


def _touch_later(path: Path) -> None:
    # A rewrite a second later, whatever the filesystem's timestamp granularity.
    later = path.stat().st_mtime + 1
    os.utime(path, (later, later))


def test_the_other_node_joins_each_launch_of_the_main_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    follow = _follow()
    monkeypatch.setenv(MAIN_ADDR_ENV, "10.1.2.3")
    stages = tmp_path / "a home with spaces" / "stages"  # paths come back whole
    two_nodes = load_recipe("paper-16gpu").training
    one_node = load_recipe("paper-8gpu").training
    old = stages / "train" / "old.partial"
    _launch(old, two_nodes.command("embodied_r.training.grpo", old / SPEC_NAME))
    os.utime(old / SPEC_NAME, (time.time() - 60, time.time() - 60))  # before the follower started

    follower = follow.Follower(stages)
    assert follower.next_launch() is None  # an earlier launch is not joined

    stage1 = stages / "train" / "k1.partial"
    cmd = two_nodes.command("embodied_r.training.grpo", stage1 / SPEC_NAME)
    stage1.mkdir(parents=True)
    write_json_atomic(stage1 / SPEC_NAME, {})
    assert follower.next_launch() is None  # the spec is written; the launch line not yet
    with open(stage1 / LOG_NAME, "a") as log:
        log.write("warming up\n$ not a launch: 'unbalanced\n" + launch_line(cmd))
    spec, found = follower.next_launch()
    assert spec == stage1 / SPEC_NAME and found == cmd
    assert follower.next_launch() is None  # joined once

    ranked = follow.for_rank(found, 1)
    at = ranked.index("accelerate.commands.launch")
    assert ranked[at + 1 : at + 3] == ["--machine_rank", "1"] and ranked[at + 3 :] == cmd[at + 1 :]

    # The stage crashed and runs again: a new spec, a new launch line, joined again.
    _launch(stage1, cmd)
    _touch_later(stage1 / SPEC_NAME)
    assert follower.next_launch() == (stage1 / SPEC_NAME, cmd)

    # A launch on one node is not this node's business; the earlier stage rerun after the
    # follower started is.
    single = stages / "sft" / "k2.partial"
    _launch(single, one_node.command("embodied_r.training.sft_child", single / SPEC_NAME))
    assert follower.next_launch() is None
    _launch(old, two_nodes.command("embodied_r.training.grpo", old / SPEC_NAME))
    os.utime(old / SPEC_NAME)
    assert follower.next_launch()[0] == old / SPEC_NAME

    env = follow.child_env()
    assert "EMBODIED_R_PARENT_PID" not in env and "MLFLOW_RUN_ID" not in env
    assert str(PROJECT_ROOT) in env["PYTHONPATH"].split(os.pathsep)


@pytest.mark.parametrize("rank, removed", [("1", False), ("0", True)])
def test_only_the_global_rank_0_removes_a_cut_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          rank: str, removed: bool) -> None:
    from embodied_r.training.checkpoints import last_checkpoint

    base = tmp_path / "checkpoints"
    cut_short(write_checkpoints(base))
    monkeypatch.setenv("RANK", rank)
    # Every process resumes from the same checkpoint; one of them clears the cut one away.
    assert last_checkpoint(tmp_path) == (str(base / "checkpoint-2"), 2)
    assert (base / "checkpoint-4").exists() is not removed
