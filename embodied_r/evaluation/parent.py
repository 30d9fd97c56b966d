"""What the evaluation shows on its pipeline run's MLflow parent (``StageKind.parent_view``): the
learning figures it charts, the GRPO stages' rewards on one step axis, the learning lines and
failure signatures of its description, and the report headed by that run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from embodied_r.evaluation.learning import (PAIRED, PHASES, curve_metric, failure_signatures, learning_table,
                                            reward_curves)
from embodied_r.stage_plan import StagePlan
from embodied_r.tracking.names import numeric_metrics


def parent_view(final: StagePlan, summary: dict[str, Any], selected: Sequence[StagePlan],
                header: dict[str, str]) -> dict[str, Any]:
    """Each policy's accuracy beside chance and the paired gain over the start with its p-value, one
    chart each (the rest stays on the evaluate run, so the parent's chart page stays short), and
    every reward of every GRPO stage as ``(metric, global step, value)``."""
    charted = {f"learning/accuracy/{p}" for p in PHASES} | {f"{PAIRED}/difference", f"{PAIRED}/p_value"}
    curves, _ = reward_curves({sp.name: sp.out for sp in selected if sp.kind == "train"})
    view: dict[str, Any] = {
        "figures": {k: v for k, v in numeric_metrics(summary).items() if k in charted},
        "curves": [(curve_metric(name), step, value) for name, series in curves.items() for step, value in series],
        "learning": learning_table(summary), "signatures": failure_signatures(summary)}
    if summary:
        from embodied_r.evaluation.report import render_folder

        view["report"] = render_folder(Path(final.out), header)
    return view
