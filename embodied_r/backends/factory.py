"""Build the backend a config names; each concrete backend is imported only when chosen,
so an environment without vLLM (or without aiohttp) still builds the others."""

from __future__ import annotations

import importlib
from pathlib import Path

from embodied_r.backends.base import Backend, BackendConfig

# Backends that exist only for the embedded default, reached by module name so that the
# method's packages import nothing of the demo's; a stage whose config says the kind hashes
# the module (``runners`` reads this table).
BY_NAME = {"world": "embodied_r.demo.world_perceiver:WorldPerceiver"}


def make_backend(cfg: BackendConfig, *, catalog: Path | None = None) -> Backend:
    """``catalog``: the questions table, for backends that read the videos' own records
    (the demo's world perceiver); the model backends ignore it."""
    if cfg.kind in BY_NAME:
        module, name = BY_NAME[cfg.kind].split(":")
        return getattr(importlib.import_module(module), name)(cfg, catalog=catalog)
    if cfg.kind == "transformers":
        from embodied_r.backends.hf_local import TransformersBackend

        return TransformersBackend(cfg)
    if cfg.kind == "openai":
        from embodied_r.backends.openai_compat import OpenAIBackend

        return OpenAIBackend(cfg)
    if cfg.kind == "vllm":
        # The module imports vLLM lazily and raises BackendUnavailable with install steps.
        from embodied_r.backends.vllm_engine import VLLMBackend

        return VLLMBackend(cfg)
    raise ValueError(f"unknown backend kind {cfg.kind!r}")
