"""Disk for a training stage's checkpoints, checked before the first step: a ZeRO-3 checkpoint
of the 3 B policy is about 43 GB (16-bit weights, fp32 master weights, two Adam moments), and a
disk that fills at step 200 loses the step and maybe the checkpoint being written."""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import struct
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied_r.errors import DiskSpaceError
from embodied_r.paths import size_text
from embodied_r.training.environment import TrainerEnvironment

log = logging.getLogger(__name__)

ADAM_STATES = 8  # two fp32 moments per trained parameter
MASTER_FP32 = 4  # DeepSpeed's fp32 copy of the weights, beside its 16-bit ones


def _safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(size))


def tensor_shapes(model: str) -> dict[str, list[int]] | None:
    """Every weight's shape from the safetensors headers of a local folder, the hub's cache or
    the hub; None where none can be read."""
    folder = Path(model).expanduser()
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files and not folder.exists():
        try:
            from huggingface_hub import snapshot_download

            cached = Path(snapshot_download(model, allow_patterns=["*.safetensors"], local_files_only=True))
            files = sorted(cached.glob("*.safetensors"))
        except Exception:  # noqa: BLE001 - not in the cache
            files = []
        if not files:
            try:
                from huggingface_hub import get_safetensors_metadata

                meta = get_safetensors_metadata(model)
                return {name: list(info.shape) for f in meta.files_metadata.values()
                        for name, info in f.tensors.items()}
            except Exception as exc:  # noqa: BLE001 - offline, or not safetensors
                log.info("cannot read the weights' shapes of %s: %s", model, exc)
                return None
    shapes: dict[str, list[int]] = {}
    for file in files:
        for name, info in _safetensors_header(file).items():
            if name != "__metadata__":
                shapes[name] = list(info["shape"])
    return shapes or None


def lora_parameters(shapes: dict[str, list[int]], r: int, target_modules: str | list[str]) -> int:
    """r x (in + out) per linear weight peft adapts: a string is a regular expression over the
    module name, a list matches name endings, ``all-linear`` all but the output head."""
    total = 0
    for name, shape in shapes.items():
        if len(shape) != 2 or not name.endswith(".weight"):
            continue
        module = name[: -len(".weight")]
        if target_modules == "all-linear":
            hit = not any(word in module for word in ("embed", "lm_head", "wte", "wpe"))
        elif isinstance(target_modules, str):
            hit = re.fullmatch(target_modules, module) is not None
        else:
            hit = any(module == t or module.endswith("." + t) for t in target_modules)
        if hit:
            total += r * (shape[0] + shape[1])
    return total


@dataclass
class CheckpointEstimate:
    parameters: int
    per_checkpoint: float  # bytes
    kept: int  # checkpoints on disk at the worst moment
    final_model: float  # bytes of the stage's saved model
    how: str  # what the per-checkpoint figure counts

    @property
    def total(self) -> float:
        return self.per_checkpoint * self.kept + self.final_model


def planned_steps(records: int, epochs: float, per_step: int, max_steps: int | None) -> int:
    steps = max(1, math.ceil(records * epochs / max(per_step, 1)))
    return min(steps, max_steps) if max_steps else steps


def world_size(env: TrainerEnvironment) -> int:
    # Else 1: more steps, so the estimate errs towards more checkpoints.
    return env.accelerate_processes() or 1


def estimate(env: TrainerEnvironment, shapes: dict[str, list[int]], steps: int) -> CheckpointEstimate:
    params = sum(math.prod(s) for s in shapes.values())
    on_gpu = env.bf16 if env.bf16 is not None else not env.use_cpu
    weight_bytes = 2 if env.bf16_weights(bool(on_gpu)) else 4
    if env.lora is not None:
        trained = lora_parameters(shapes, env.lora.r, env.lora.target_modules)
        per = trained * (4 + (0 if env.save_only_model else ADAM_STATES))
        how = f"LoRA adapters, {trained / 1e6:.1f} M parameters in fp32" + ("" if env.save_only_model else " + Adam")
    elif env.deepspeed():
        per = params * (2 + (0 if env.save_only_model else MASTER_FP32 + ADAM_STATES))
        how = "DeepSpeed: 16-bit weights" + ("" if env.save_only_model else " + fp32 master weights + Adam")
    else:
        per = params * (weight_bytes + (0 if env.save_only_model else ADAM_STATES))
        how = f"{'bf16' if weight_bytes == 2 else 'fp32'} weights" + ("" if env.save_only_model else " + Adam")
    saves = steps // env.save_steps + 1  # the trainer also saves at the last step
    # Rotation writes the new checkpoint before it deletes the oldest: one more at the peak.
    kept = saves if env.save_total_limit is None else min(saves, env.save_total_limit + 1)
    return CheckpointEstimate(params, float(per), kept, float(params * weight_bytes), how)


def free_bytes(path: Path) -> int:
    path = Path(path).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(out: Path, model: str, env: TrainerEnvironment, steps: int, what: str,
               existing: int = 0, kept_after: int = 0) -> CheckpointEstimate | None:
    """Fail before ``what`` starts when its checkpoints would not fit beside ``out``.
    ``existing``: bytes of checkpoints a resumed stage has on the disk already; ``kept_after``:
    checkpoints that stay after the stage (a resume chain's state)."""
    shapes = tensor_shapes(model)
    if shapes is None:
        log.warning("%s: cannot estimate the checkpoints' size (the weights of %s are not readable "
                    "here); the free disk is not checked", what, model)
        return None
    est = estimate(env, shapes, steps)
    if kept_after:
        est = dataclasses.replace(est, kept=est.kept + kept_after)
    free = free_bytes(out) + existing
    if est.total > free:
        raise DiskSpaceError(
            f"{what} needs about {size_text(est.total)} of disk under {out} but {size_text(free)} are free: "
            f"{est.kept} checkpoint(s) at the worst moment x {size_text(est.per_checkpoint)} "
            f"({est.parameters / 1e9:.2f} B parameters; {est.how}) + the final model "
            f"{size_text(est.final_model)}, over {steps} steps saved every {env.save_steps}. "
            f"Lower training.save_total_limit (now {env.save_total_limit}), raise training.save_steps "
            f"(now {env.save_steps}), set training.save_only_model: true (weights only; a resumed stage "
            "restarts the optimizer; not with stage_chain: resume), or free space."
        )
    log.info("%s: checkpoints need about %s, %s free", what, size_text(est.total), size_text(free))
    return est
