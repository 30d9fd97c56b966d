"""Where the project keeps its files: models, stage outputs, the MLflow store, Prefect results."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """``$EMBODIED_R_HOME``, else ``~/.embodied-r``. May be a shared filesystem when
    work pools run on different machines."""
    return Path(os.environ.get("EMBODIED_R_HOME") or Path.home() / ".embodied-r").expanduser().resolve()


def stages_root(root: Path | None = None) -> Path:
    return (root or home()) / "stages"


def default_tracking_uri(root: Path | None = None) -> str:
    return f"sqlite:///{(root or home()) / 'mlflow.db'}"


def artifacts_root(root: Path | None = None) -> Path:
    return (root or home()) / "mlartifacts"


def prefect_results(root: Path | None = None) -> Path:
    return (root or home()) / "prefect-results"
