"""The rehearsal's verdicts on what a run wrote, its planted faults and small helpers: pure where
it can be, so that the verdicts are tested without vLLM or DeepSpeed."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

RECIPE = "rehearsal"
REFERENCE_NAME = "rehearsal-reference"
TWO_NODES = "infra/training/accelerate-zero3-rehearsal-2nodes.yaml"
# One short stage of the rehearsal recipe's shape: what the two-node and pool items train.
ONE_STAGE = '[{"name": "%s", "epochs": 1, "rewards": {"format": 0.7, "accuracy": 0.3}}]'


class Failed(Exception):
    """An item's verdict: what went wrong, in one line."""


# The planted faults, a sitecustomize first on the trainer's PYTHONPATH, each one more hook of the
# adapters' import finder. skip-sync: TRL's sync writes nothing into the engine. stale-head: the
# tied head computes from a copy of the embeddings taken at load, as vLLM's CPU build does where
# its packing copies that matrix (in bfloat16). restart-at-zero: a resume finds no checkpoint.
PLANT = '''
import os
import embodied_r_cpu_adapters as adapters

def _skip_sync(module):
    module.VLLMGeneration.sync_weights = lambda self: self.llm.reset_prefix_cache()
    return True

def _stale_head(module):
    import torch.nn.functional as F

    def packed_once(self, layer):
        frozen = layer.weight.detach().clone()
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, frozen, bias)

    module.UnquantizedEmbeddingMethod.process_weights_after_loading = packed_once
    return True

def _restart_at_zero(module):
    module.last_checkpoint = lambda work: (None, 0)
    return True

plant = os.environ.get("EMBODIED_R_REHEARSAL_PLANT")
if plant == "skip-sync":
    adapters._HOOKS["trl.generation.vllm_generation"] = ("after", _skip_sync)
elif plant == "stale-head":
    adapters._HOOKS["vllm.model_executor.layers.vocab_parallel_embedding"] = ("after", _stale_head)
elif plant == "restart-at-zero":
    adapters._HOOKS["embodied_r.training.checkpoints"] = ("after", _restart_at_zero)
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def zero3_problems(stages: list[dict[str, Any]], killed_step: int, resumed: dict[str, Any]) -> list[str]:
    """What is wrong with three chained GRPO stages on two processes whose stage 2 lost a rank
    after ``checkpoint-<killed_step>`` (``resumed``: its ``checkpoint_figures``) and resumed."""
    names = ("stage1", "stage2", "stage3")
    problems = []
    for name, s in zip(names, stages):
        if s.get("processes") != 2:
            problems.append(f"{name} trained in {s.get('processes')} processes")
        checks, gap = s.get("vllm_sync_checks"), s.get("vllm_sync_max_gap")
        if not checks or checks != s.get("steps_this_run") or gap is None or gap > s.get("vllm_sync_tolerance", 0):
            problems.append(f"{name}: {checks} sync checks over {s.get('steps_this_run')} steps, largest gap {gap}")
    # Stage 3 starts where stage 2 left Adam and the schedule; stage 2's own start is its resume.
    before, after = stages[1], stages[2]
    adam_end = before.get("first_adam_step", 0) + before.get("steps_this_run", 0)
    if not close(after.get("first_learning_rate"), before.get("last_learning_rate")):
        problems.append(f"stage3 started at lr {after.get('first_learning_rate')}, where the chain's schedule left "
                        f"off at {before.get('last_learning_rate')}")
    if after.get("first_adam_step") != adam_end:
        problems.append(f"stage3 started at Adam's step {after.get('first_adam_step')}, stage2 ended at {adam_end}")
    second = stages[1]
    if second.get("resumed_from_step") != killed_step or \
            second.get("steps_this_run") != second.get("steps", 0) - killed_step:
        problems.append(f"stage2 resumed from step {second.get('resumed_from_step')} and ran "
                        f"{second.get('steps_this_run')} of {second.get('steps')} steps (killed after {killed_step})")
    if second.get("first_adam_step") != resumed["adam_step"]:
        problems.append(f"stage2's Adam step after the resume {second.get('first_adam_step')}, "
                        f"checkpoint-{killed_step}'s {resumed['adam_step']}")
    # The chain's one schedule stood after all of stage 1's steps and stage 2's first ones (a stage
    # that restarted the schedule stands at its own step count).
    position = stages[0].get("steps", 0) + killed_step
    if resumed["schedule_step"] != position:
        problems.append(f"checkpoint-{killed_step} of stage2 holds the schedule at step {resumed['schedule_step']}, "
                        f"the chain's is {position}: stage 2 did not carry on stage 1's schedule")
    if not close(second.get("first_learning_rate"), resumed["next_lr"]):
        problems.append(f"stage2's learning rate after the resume {second.get('first_learning_rate')}, "
                        f"checkpoint-{killed_step}'s schedule gives {resumed['next_lr']}")
    return problems


def predictions(folder: Path) -> dict[str, dict[str, Any]]:
    import pyarrow.parquet as pq

    return {row["uid"]: row for row in pq.read_table(Path(folder) / "predictions.parquet").to_pylist()}


def agreement(ours: dict[str, dict[str, Any]], theirs: dict[str, dict[str, Any]]) -> tuple[float, float]:
    """Of ``theirs``' questions, the shares ``ours`` answers with the same parsed answer and with
    the same completion; a question ``ours`` lacks counts as different."""
    if not theirs:
        raise ValueError("no predictions to compare")
    answer = sum(1 for uid, row in theirs.items() if uid in ours and ours[uid]["prediction"] == row["prediction"])
    text = sum(1 for uid, row in theirs.items() if uid in ours and same_text(ours[uid]["completion"], row["completion"]))
    return answer / len(theirs), text / len(theirs)


def checkpoint_figures(folder: Path) -> dict[str, Any]:
    """Adam's step count (rank 0's ZeRO-3 shard), the schedule's step and the learning rate it
    gives the next step."""
    import torch

    state = json.loads((folder / "trainer_state.json").read_text())
    schedule = torch.load(folder / "scheduler.pt", map_location="cpu", weights_only=False)
    next_lr = schedule["_last_lr"][0]
    shard = next(folder.glob("global_step*/*optim_states.pt"))
    optim = torch.load(shard, map_location="cpu", weights_only=False)["optimizer_state_dict"]
    inner = optim.get("optimizer_state_dict", optim)
    steps = [v["step"] for v in inner["state"].values() if "step" in v]
    return {"adam_step": int(float(steps[0])), "next_lr": next_lr, "schedule_step": int(schedule["last_epoch"]),
            "global_step": state["global_step"]}


def same_text(a: str, b: str) -> bool:
    """Equal up to a last character cut inside a UTF-8 sequence: vLLM holds back its bytes,
    transformers shows them as U+FFFD (a random tiny model ends on such bytes often)."""
    return a.rstrip("\ufffd") == b.rstrip("\ufffd")


def close(a: Any, b: Any) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) <= 1e-9 + 1e-6 * abs(float(b))


def last_error(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return f"no log at {log}"
    errors = [line for line in lines if "Error" in line or line.startswith("error")]
    return (errors or lines or ["(empty log)"])[-1][:400]
