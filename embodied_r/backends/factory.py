"""Build the backend a config names, importing only its class's module."""

from __future__ import annotations

import importlib
from pathlib import Path

from embodied_r.backends.base import Backend, BackendConfig
from embodied_r.backends.registry import BY_NAME


def make_backend(cfg: BackendConfig, *, catalog: Path | None = None) -> Backend:
    """``catalog``: the questions table, for the stand-in that reads it; models ignore it."""
    kind = BY_NAME[cfg.kind]
    module, name = kind.target.split(":")
    backend = getattr(importlib.import_module(module), name)
    return backend(cfg, catalog=catalog) if kind.stand_in else backend(cfg)
