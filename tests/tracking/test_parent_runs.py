"""What a researcher reads on a pipeline's parent runs in a real MLflow store: names that start
with what tells them apart, the headline columns rounded, the learning block in the description
and in report.md, links that open MLflow's model-training view, one reward axis shared with
``reward_curves.png``, a warm start and training stages whose summaries are params, and the
console's closing lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.pipeline_runs import STEPS, WARMSTART_STEPS, Runs, make_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return make_runs(tmp_path_factory.mktemp("parents"))


def _client(runs: Runs):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=runs.uri)


def note_links(note: str) -> list[str]:
    return re.findall(r"\]\(([^)]+)\)", note)


def test_parent_names_start_with_their_cache_status(runs: Runs) -> None:
    client = _client(runs)
    fresh, cached = client.get_run(runs.fresh), client.get_run(runs.cached)
    assert re.fullmatch(r"fresh demo \d{4}-\d\d-\d\d \d\d:\d\d", fresh.info.run_name), fresh.info.run_name
    assert cached.info.run_name.startswith("cached demo ")
    assert fresh.data.tags["cache_status"] == "fresh" and cached.data.tags["cache_status"] == "cached"
    from embodied_r.tracking.names import finished_name

    assert finished_name("demo 2026-01-01 10:00", "partly cached (3/12)") == "partly cached demo 2026-01-01 10:00"
    assert finished_name("cached demo x", "cached") == "cached demo x"


def test_the_run_list_columns_are_rounded_percentages(runs: Runs) -> None:
    metrics = _client(runs).get_run(runs.cached).data.metrics
    assert metrics["test/trained"] == 32.3 and metrics["test/warmstart"] == 22.6
    assert metrics["test/untrained"] == 0.0 and metrics["test/chance"] == 27.3
    assert metrics["test/questions"] == 31
    # Comparing parents starts on the headline: per-task accuracies stay on the evaluate run.
    assert "accuracy/overall" in metrics and "accuracy/action_generation" not in metrics
    assert "learning/accuracy/trained" in metrics and not [m for m in metrics if m.endswith(("_ci_low", "_quarter"))]


def test_the_parent_description_carries_the_learning_block(runs: Runs) -> None:
    note = _client(runs).get_run(runs.cached).data.tags["mlflow.note.content"]
    assert "**cached** run of recipe `demo`" in note
    assert "| warm-started | 22.6 % [" in note and "| GRPO-trained | 32.3 % [" in note
    assert "| untrained | 0.0 % [" in note and "| chance | 27.3 % (a guesser lands in [15.0, 40.0])" in note
    assert "**The GRPO-trained reasoner scores 32.3 %, above chance (27.3 %) and the warm-started policy" in note


def test_every_link_the_project_writes_opens_the_training_view(runs: Runs) -> None:
    from embodied_r.tracking.names import run_url, runs_url

    client = _client(runs)
    links = [run_url(runs.uri, runs.experiment_id, runs.fresh), runs_url(runs.uri, runs.experiment_id)]
    for run_id in (runs.fresh, runs.cached):
        links += note_links(client.get_run(run_id).data.tags["mlflow.note.content"])
    children = client.search_runs([runs.experiment_id], f"tags.mlflow.parentRunId = '{runs.cached}'")
    links += [link for c in children for link in note_links(c.data.tags.get("mlflow.note.content", ""))]
    assert len(links) >= 12
    for link in links:
        assert "workflowType=machine_learning" in link.split("?", 1)[-1], link
    assert any(link.endswith("/artifacts/reward_curves.png?workflowType=machine_learning") for link in links)


def test_the_cached_parent_names_the_run_its_model_is_registered_under(runs: Runs) -> None:
    note = _client(runs).get_run(runs.cached).data.tags["mlflow.note.content"]
    line = next(line for line in note.splitlines() if line.startswith("Registered model"))
    assert "[embodied-r-reasoner v1](#/models/embodied-r-reasoner/versions/1?workflowType" in line
    assert f"/runs/{runs.fresh}?workflowType" in line and "same files" in line
    fresh_note = _client(runs).get_run(runs.fresh).data.tags["mlflow.note.content"]
    assert "same files" not in fresh_note and "Registered model: [embodied-r-reasoner v1]" in fresh_note


def test_the_parents_report_has_the_learning_section(runs: Runs, tmp_path: Path) -> None:
    client = _client(runs)
    text = Path(client.download_artifacts(runs.cached, "report.md", str(tmp_path))).read_text()
    assert "- run: cached demo " in text
    assert "## Learning" in text and "| GRPO-trained | 32.3 % [" in text and "![reward curves](reward_curves.png)" in text
    assert {"report.md", "reward_curves.png"} <= {a.path for a in client.list_artifacts(runs.cached)}


def test_the_parent_charts_all_stages_rewards_on_the_trainers_global_step(runs: Runs) -> None:
    from embodied_r.evaluation.learning import reward_curves

    client = _client(runs)
    steps = sorted(m.step for m in client.get_metric_history(runs.cached, "reward/total"))
    assert steps == list(range(WARMSTART_STEPS + 1, WARMSTART_STEPS + 3 * STEPS + 1))
    assert len(client.get_metric_history(runs.cached, "reward/format")) == 3 * STEPS
    # reward_curves.png draws the same step numbers as MLflow.
    curves, starts = reward_curves({n: sp.out for n, sp in runs.stages.items() if sp.kind == "train"})
    assert [s for s, _ in curves["reward"]] == steps
    assert [s for _, s in starts] == [WARMSTART_STEPS, WARMSTART_STEPS + STEPS, WARMSTART_STEPS + 2 * STEPS]


def test_a_training_stage_summary_goes_to_params_not_one_chart_per_figure() -> None:
    from embodied_r.stage_kinds import kind_of
    from embodied_r.tracking.names import stage_record

    summary = {"steps": 36, "final_reward": 0.41234567, "epochs_reached": 2.0, "seconds": 50.1,
               "quarters": {"format": {"first": 0.5}}}
    metrics, params = stage_record(summary, kind_of("train").summary_as_params)
    assert params == {"summary.steps": "36", "summary.final_reward": "0.4123", "summary.epochs_reached": "2",
                      "summary.quarters.format.first": "0.5"}
    assert metrics == {"timing/seconds": 50.1}
    assert stage_record({"done": 3}, kind_of("keyframes").summary_as_params) == ({"summary/done": 3.0}, {})


def test_the_cached_warm_start_copies_the_trainers_params(tmp_path: Path) -> None:
    from embodied_r.pipeline import StagePlan
    from embodied_r.stage_kinds import kind_of
    from embodied_r.tracking.runs import Tracker
    from embodied_r.tracking.record import log_cached_stage, stage_params

    out = tmp_path / "warm"
    out.mkdir()
    (out / "summary.json").write_text('{"steps": 3}')
    sp = StagePlan("warmstart", "warmstart", "kw", str(out), (), config={"epochs": 2})
    tracker = Tracker.open("warm", f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path)
    first = tracker.start_parent("p1", {}, {})
    source = first.start_stage("warmstart", stage_params(sp, kind_of(sp.kind)), tags={"stage_key": "kw"})
    first.log_params(source, {"trainer.learning_rate": "0.003", "summary.steps": "3"})
    first.finish(source)
    second = tracker.start_parent("p2", {}, {})
    log_cached_stage(second, sp, kind_of(sp.kind), {"steps": 3})
    child = second.client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{second.parent_run_id}'")[0]
    assert child.info.run_name == "warmstart"
    assert child.data.params == {"warmstart.epochs": "2", "trainer.learning_rate": "0.003", "summary.steps": "3"}


def test_the_console_closes_with_counts_percent_and_the_sidebar_hint(runs: Runs, capsys) -> None:
    from embodied_r.apps.cli import _print_outcome
    from embodied_r.tracking.names import SIDEBAR_HINT, run_url, runs_url
    from tests.pipeline_runs import FINAL

    _print_outcome({"evaluation": FINAL, "tracking_uri": runs.uri, "mlflow_run_id": runs.cached,
                    "mlflow_run_url": run_url(runs.uri, runs.experiment_id, runs.cached),
                    "mlflow_runs_url": runs_url(runs.uri, runs.experiment_id)}, 1.0)
    out = capsys.readouterr().out
    assert re.search(r"route_planning +1 +100\.0 % \[", out) and re.search(r"action_generation +30 +30\.0 %", out)
    assert "stage1   mean reward, first -> last quarter: format_reward 50.0 -> 90.0 %" in out
    assert out.rstrip().splitlines()[-1] == SIDEBAR_HINT and "Model training" in SIDEBAR_HINT
    # Every figure of the closing summary in percent: no bare fraction such as 0.323 or 1.000.
    summary = out[out.index("Test accuracy"):out.index("MLflow store")]
    assert not re.search(r"(?<![\d.])[01]\.\d{2,}(?![\d])", summary), summary


def test_mlflow_does_not_announce_its_store_tables(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("from embodied_r.tracking.runs import Tracker; "
            f"Tracker.open('x', 'sqlite:///{tmp_path / 'm.db'}', __import__('pathlib').Path('{tmp_path}'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "Creating initial MLflow database tables" not in done.stderr + done.stdout
    assert "Updating database tables" not in done.stderr + done.stdout


def test_a_locally_built_model_is_logged_without_hub_card_and_licence_warnings(tiny_lm_path: Path,
                                                                              tmp_path: Path) -> None:
    import logging

    from embodied_r.evaluation.registry import save_flavour

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("mlflow.transformers")
    handler = Keep(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        dest = save_flavour(tiny_lm_path, tmp_path / "flavour")
    finally:
        logger.removeHandler(handler)
    assert not [m for m in seen if "model card" in m or "license" in m.lower()], seen
    assert (dest / "MLmodel").is_file() and "embodied-r" in (dest / "model_card.md").read_text()
