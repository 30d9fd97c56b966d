"""Scheduled re-evaluation: score a registry alias (the champion by default) on a recipe's
records, so a new checkpoint or a changed scorer shows up in MLflow without a retrain."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Completed, State

from embodied_r.evaluation.registry import CHAMPION, alias_version, parse_model_uri
from embodied_r.tracking.record import flow_run_id
from embodied_r.tracking.runs import Tracker, record_stage
from embodied_r.tracking.store import check_store, tracking_uri
from flows.cancel_watch import watch_cancel
from flows.runner import plan_of, recipe_of, scoped_env

# A model given as ``@alias`` names that alias of the recipe's own registered model, so a
# deployment made for one recipe follows that recipe's registry entry.
DEFAULT_MODEL = f"@{CHAMPION}"


def model_uri(model: str, registered_model: str) -> str:
    """``@alias`` as ``models:/<registered_model>@alias``; any other reference as given."""
    return f"models:/{registered_model}{model}" if model.startswith("@") else model


def no_alias_line(uri: str, store: str, recipe: str) -> str | None:
    """One line when ``uri`` is a registry alias that points at no version yet, else None."""
    if not uri.startswith("models:/"):
        return None
    ref = parse_model_uri(uri)
    if ref.alias is None or alias_version(ref.name, ref.alias, store) is not None:
        return None
    return (f"nothing to re-evaluate: {ref.name} has no @{ref.alias} yet in {store}; a pipeline run promotes "
            f"its reasoner when it beats the bars, or promote one with `embodied-r promote --recipe {recipe}`")


@flow(name="embodied-r-reevaluate", log_prints=True)
def reevaluate(model: str = DEFAULT_MODEL, recipe: str = "demo", split: str = "test",
               overrides: dict[str, Any] | None = None, home: str | None = None) -> dict[str, Any] | State:
    """Evaluate ``model`` (``@<alias>``, a registry URI or a folder) on ``split`` of the converted
    records, one MLflow run per call; before the alias exists the run ends ``Skipped``."""
    watch_cancel()
    from prefect.artifacts import create_table_artifact

    from embodied_r.lifecycle.models import evaluate_model
    from embodied_r.evaluation.report import REPORT_FILES, table_rows_from_folder

    stages = plan_of("embodied-r", recipe, overrides, home)
    root, rec = stages.root, recipe_of(stages)
    uri = tracking_uri(rec.tracking.tracking_uri, root)
    ref = model_uri(model, rec.tracking.registered_model)
    with scoped_env(EMBODIED_R_HOME=str(root), MLFLOW_TRACKING_URI=uri):
        check_store(uri)  # the score is logged there: a store that cannot take it is said first
        skipped = no_alias_line(ref, uri, rec.name)
        if skipped:
            get_run_logger().warning(skipped)
            return Completed(name="Skipped", message=skipped)
        out, summary = evaluate_model(rec, ref, split, stages)
        tracker = Tracker.open(rec.tracking.experiment, uri, root)
        run_id = tracker.start_stage("reevaluate", {"model": ref, "split": split, "recipe": rec.name},
                                     tags={"prefect.flow_run_id": flow_run_id(), "output": str(out),
                                           "model_version": str(summary.get("model_ref") or "")})
        record_stage(tracker, run_id, out, summary)
        tracker.log_artifacts(run_id, [out / f for f in REPORT_FILES])
        tracker.finish(run_id)
    create_table_artifact(table=table_rows_from_folder(out), key="reevaluation-accuracy",
                          description=f"{ref} on the {split} split")
    get_run_logger().info("%s on %s: overall %.3f", ref, split, summary.get("accuracy/overall", 0.0))
    return {"mlflow_run_id": run_id, "output": str(out), "summary": summary}
