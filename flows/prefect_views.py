"""How a pipeline run reads in Prefect: flow runs named after recipe and time and tagged with
the recipe, and one markdown artifact per flow run with the results and the MLflow link."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

RESULT_KEY = "embodied-r-result"


def recipe_label(recipe: str) -> str:
    """A recipe's name as given: ``demo``, or the stem of a YAML path."""
    return Path(recipe).stem if recipe.endswith((".yaml", ".yml")) else recipe


def flow_run_name() -> str:
    """``demo 2026-11-23 14:05:31`` for the flow run of recipe ``demo`` (Prefect calls this)."""
    from prefect.runtime import flow_run

    recipe = recipe_label(str((flow_run.parameters or {}).get("recipe", "run")))
    return f"{recipe} {time.strftime('%Y-%m-%d %H:%M:%S')}"


def tag_flow_run(recipe: str) -> None:
    """Add ``recipe:<name>`` to the current flow run's tags, whichever way it was started."""
    from prefect.client.orchestration import get_client
    from prefect.context import get_run_context

    try:
        run = get_run_context().flow_run
        wanted = sorted(set(run.tags or []) | {f"recipe:{recipe_label(recipe)}"})
        with get_client(sync_client=True) as client:
            client.update_flow_run(run.id, tags=wanted)
    except Exception:  # noqa: BLE001 - a label must never fail the pipeline
        pass


def _pct(value: Any) -> str:
    return f"{100 * value:.1f} %" if isinstance(value, (int, float)) else "-"


def result_markdown(recipe: str, result: dict[str, Any]) -> str:
    """The flow run's result for a reader: accuracy, stages (fresh or cached) and MLflow links."""
    final = result.get("evaluation") or {}
    cached = set(result.get("cached") or [])
    lines = [f"# Embodied-R: {recipe_label(recipe)}", ""]
    if final:
        lines += [f"Test accuracy on the `{final.get('split', '?')}` split "
                  f"({int(final.get('count/overall', 0))} questions): overall **{_pct(final.get('accuracy/overall'))}**, "
                  f"macro {_pct(final.get('accuracy/macro'))}, paper tasks {_pct(final.get('accuracy/paper_tasks'))}", ""]
    if result.get("mlflow_run_url"):
        lines += [f"MLflow run: [{result['mlflow_run_id']}]({result['mlflow_run_url']}) "
                  f"(store `{result.get('tracking_uri', '')}`)", ""]
    if result.get("mlflow_runs_url"):
        lines += [f"All runs, headline columns: [run list]({result['mlflow_runs_url']})", ""]
    if result.get("promotion"):
        lines += [f"Registry: {result['promotion']}", ""]
    lines += ["| stage | status | output |", "|---|---|---|"]
    for name, out in (result.get("stages") or {}).items():
        lines.append(f"| {name} | {'cached' if name in cached else 'ran'} | `{out}` |")
    return "\n".join(lines) + "\n"


def publish_result(recipe: str, result: dict[str, Any]) -> None:
    from prefect.artifacts import create_markdown_artifact

    try:
        create_markdown_artifact(result_markdown(recipe, result), key=RESULT_KEY,
                                 description="Pipeline result: accuracy, stages and the MLflow run")
    except Exception:  # noqa: BLE001 - an artifact is a convenience, not the result
        pass
