"""Which GPU a model goes to and in which precision: one place for the hardware's answers.

- Precision. bf16 needs a GPU that computes in it natively (compute capability 8.0 and
  later: A100, H100, L4, RTX 30xx...). ``torch.cuda.is_bf16_supported()`` also answers yes on
  a V100 or T4, where bf16 is emulated, many times slower; so native support is asked for.
  Without it, training falls back to fp16 mixed precision (fp32 weights, loss scaling) and
  inference to fp16, each saying so in one line.
- Placement. A transformers model with device ``auto`` spreads over every GPU
  (``device_map="auto"``) when one process owns the machine. Under a launch of several
  processes (``accelerate launch``, torchrun: ``LOCAL_RANK`` and ``WORLD_SIZE`` set) each
  process owns one GPU, and ``auto`` in every rank would put every copy on GPU 0: there it
  means the rank's own GPU.

The CUDA queries are the functions below, so a test can stand in for hardware it lacks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def native_bf16() -> bool:
    """Whether the current CUDA device computes in bf16 natively (not emulated)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Precision:
    """How a trainer computes: ``bf16`` or ``fp16`` mixed precision, or neither (fp32).
    ``note``: the one line that says why it differs from what was asked, else None."""

    bf16: bool
    fp16: bool = False
    note: str | None = None

    @property
    def name(self) -> str:
        return "bf16" if self.bf16 else "fp16" if self.fp16 else "fp32"


def training_precision(bf16: bool | None, use_cpu: bool) -> Precision:
    """The precision of a trainer asked for ``bf16`` (None: on a GPU yes, on the CPU no).

    On a GPU without native bf16, a bf16 request (or the default) becomes fp16 mixed
    precision with fp32 weights; ``bf16: false`` stays fp32. On the CPU, ``bf16: true`` is
    autocast on the CPU, as asked."""
    on_gpu = not use_cpu and cuda_available()
    if bf16 is False or (bf16 is None and not on_gpu):
        return Precision(bf16=False)
    if not on_gpu or native_bf16():
        return Precision(bf16=True)
    return Precision(bf16=False, fp16=True, note=(
        f"{device_name()} has no native bf16: training in fp16 mixed precision (fp32 weights, loss "
        "scaling); set training.bf16: false for fp32"))


def inference_dtype(on_gpu: bool) -> str:
    """The dtype a model loads in for inference: bf16 on a GPU that has it, else fp16 on a
    GPU, fp32 on the CPU."""
    if not on_gpu:
        return "float32"
    return "bfloat16" if native_bf16() else "float16"


def launch_rank(env: Mapping[str, str] | None = None) -> tuple[int | None, int]:
    """(local rank, world size) of this process in a multi-process launch; (None, 1) alone."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE") or 1)
    local = env.get("LOCAL_RANK")
    return (int(local) if local not in (None, "") and world > 1 else None), world


def placement(device: str, cuda: bool, local_rank: int | None) -> tuple[str, str | None]:
    """Where a transformers model loads: (device, device_map or None).

    ``device``: the config's ("auto", "cpu", "cuda" or "cuda:N"); ``cuda``: whether a GPU is
    present; ``local_rank``: this process's rank on its machine in a multi-process launch,
    None alone. Alone, ``auto`` spreads the model over every GPU; in a launch, ``auto`` and a
    bare ``cuda`` mean the rank's own GPU, so the ranks do not all load onto GPU 0. A
    numbered ``cuda:N`` is taken as given."""
    if device == "auto":
        if not cuda:
            return "cpu", None
        if local_rank is None:
            return "cuda", "auto"
        return f"cuda:{local_rank}", None
    if device == "cuda" and local_rank is not None:
        return f"cuda:{local_rank}", None
    return device, None
