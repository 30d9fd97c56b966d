"""Build the backend a config names; each concrete backend is imported only when chosen,
so an environment without vLLM (or without aiohttp) still builds the others."""

from __future__ import annotations

from embodied_r.backends.base import Backend, BackendConfig


def make_backend(cfg: BackendConfig) -> Backend:
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
