"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

# Prefect's telemetry fails offline and leaves "database is locked" tracebacks.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # Tests run against the working tree whether or not the package is installed.
    sys.path.insert(0, str(ROOT))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def embodied_r_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point ``EMBODIED_R_HOME`` at a private folder for the whole session, so no test
    reads or writes the user's ``~/.embodied-r``."""
    home = tmp_path_factory.mktemp("embodied_r_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBODIED_R_HOME", str(home))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield home


@pytest.fixture(scope="session")
def tiny_lm_path(embodied_r_home: Path) -> Path:
    """A tiny random-weight Qwen2 causal LM with tokenizer, built once per session."""
    from embodied_r.backends.tiny_models import ensure_tiny_lm

    return ensure_tiny_lm(embodied_r_home / "models")


@pytest.fixture(scope="session")
def tiny_vlm_path(embodied_r_home: Path) -> Path:
    """A tiny random-weight Qwen2.5-VL model, tokenizer and image processor, built once."""
    from embodied_r.backends.tiny_models import ensure_tiny_vlm

    return ensure_tiny_vlm(embodied_r_home / "models")
