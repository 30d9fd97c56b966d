"""Scheduled re-evaluation: score a registry alias (the champion by default) on a recipe's
records, so a new checkpoint or a changed scorer shows up in MLflow without a retrain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from embodied_r import paths
from embodied_r.config import load_recipe
from embodied_r.evaluation.registry import CHAMPION
from embodied_r.tracking import Tracker, record_stage, tracking_uri
from flows.runner import flow_run_id, scoped_env


@flow(name="embodied-r-reevaluate", log_prints=True)
def reevaluate(model: str = f"models:/embodied-r-reasoner@{CHAMPION}", recipe: str = "demo",
               split: str = "test", overrides: dict[str, Any] | None = None,
               home: str | None = None) -> dict[str, Any]:
    """Evaluate ``model`` (a registry URI such as ``models:/embodied-r-reasoner@champion``,
    or a folder) on ``split`` of the recipe's converted records; one MLflow run per call."""
    from prefect.artifacts import create_table_artifact

    from embodied_r.lifecycle.models import evaluate_model
    from embodied_r.evaluation.report import REPORT_FILES, table_rows_from_folder

    root = paths.claim_home(Path(home).expanduser().resolve() if home else paths.home())
    rec = load_recipe(recipe, overrides)
    uri = tracking_uri(rec.tracking.tracking_uri, root)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        out, summary = evaluate_model(rec, model, split, root)
        tracker = Tracker.open(rec.tracking.experiment, uri, root)
        run_id = tracker.start_stage("reevaluate", {"model": model, "split": split, "recipe": rec.name},
                                     tags={"prefect.flow_run_id": flow_run_id(), "output": str(out),
                                           "model_version": str(summary.get("model_ref") or "")})
        record_stage(tracker, run_id, out, summary)
        tracker.log_artifacts(run_id, [out / f for f in REPORT_FILES])
        tracker.finish(run_id)
    create_table_artifact(table=table_rows_from_folder(out), key="reevaluation-accuracy",
                          description=f"{model} on the {split} split")
    get_run_logger().info("%s on %s: overall %.3f", model, split, summary.get("accuracy/overall", 0.0))
    return {"mlflow_run_id": run_id, "output": str(out), "summary": summary}
