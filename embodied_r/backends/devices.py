"""Which GPU a model goes to and in which precision. The CUDA queries are functions here, so
a test can stand in for hardware it lacks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def native_bf16() -> bool:
    """bf16 computed natively: ``is_bf16_supported()`` alone also says yes on a V100 or T4,
    where it is emulated, many times slower."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Precision:
    """``bf16`` or ``fp16`` mixed precision, or neither (fp32); ``note``: why it differs from
    what was asked."""

    bf16: bool
    fp16: bool = False
    note: str | None = None

    @property
    def name(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"


def training_precision(bf16: bool | None, use_cpu: bool) -> Precision:
    """``bf16`` None: on a GPU yes, on the CPU no. A GPU without native bf16 trains in fp16
    mixed precision instead."""
    on_gpu = not use_cpu and cuda_available()
    if bf16 is False or (bf16 is None and not on_gpu):
        return Precision(bf16=False)
    if not on_gpu or native_bf16():
        return Precision(bf16=True)
    return Precision(bf16=False, fp16=True, note=(
        f"{device_name()} has no native bf16: training in fp16 mixed precision (fp32 weights, loss "
        "scaling); set training.bf16: false for fp32"))


def inference_dtype(on_gpu: bool) -> str:
    if not on_gpu:
        return "float32"
    return "bfloat16" if native_bf16() else "float16"


def launch_rank(env: Mapping[str, str] | None = None) -> tuple[int | None, int]:
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE") or 1)
    local = env.get("LOCAL_RANK")
    return (int(local) if local not in (None, "") and world > 1 else None), world


def placement(device: str, cuda: bool, local_rank: int | None) -> tuple[str, str | None]:
    """(device, device_map or None). Alone, ``auto`` spreads the model over every GPU; in a
    multi-process launch, ``auto`` and ``cuda`` mean the rank's own GPU, so the ranks do not
    all load onto GPU 0."""
    if device == "auto":
        if not cuda:
            return "cpu", None
        if local_rank is None:
            return "cuda", "auto"
        return f"cuda:{local_rank}", None
    if device == "cuda" and local_rank is not None:
        return f"cuda:{local_rank}", None
    return device, None
