"""A recipe's ``tracking`` section: the MLflow experiment and store, the registered model and
the bars its promotion is held to, and how long a run waits for a store that stopped answering."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from embodied_r.settings import operational
from embodied_r.tracking.names import MODEL_NAME

# A server restart takes minutes; what a run logs meanwhile is kept and sent once it answers.
DEFAULT_OUTAGE_S = 600.0


class TrackingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    experiment: str = "embodied-r"
    # None: $MLFLOW_TRACKING_URI, else a SQLite store under the project home.
    tracking_uri: str | None = None
    registered_model: str = MODEL_NAME
    # After evaluation, register the trained reasoner (once per model) and give it the
    # champion alias when it beats chance, the warm-started policy (recipes with a warm
    # start) and the current champion on ``promote_split``.
    promote: bool = False
    promote_split: Literal["train", "val", "test"] = "val"
    promote_metric: str = "accuracy/overall"
    # How long a run waits for a tracking server that stopped answering before it goes on
    # untracked (``tracking.link``).
    outage_s: float = operational(DEFAULT_OUTAGE_S, ge=0)
