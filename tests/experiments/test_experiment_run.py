"""An experiment run end to end on the smoke recipe, from the command line, under Prefect's
test harness and a real MLflow store: a pipeline variant, one that differs in its evaluation
only, and the SFT baseline, each evaluated in distribution and on an out-of-distribution task
family; shared stages run once; the table, the paired comparison and the MLflow runs."""

from __future__ import annotations

from pathlib import Path

import pytest

# A whole experiment (three variants, in and out of distribution) is minutes of training on
# two busy cores: the learning demo's limit, not the per-test default.
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(1800)]

EXPERIMENT = """\
baseline: grpo
out_of_distribution: true
variants:
  grpo: {}
  official-parser:
    set: {evaluation.answer_parser: official}
  sft:
    train: sft
measures:
  - {source: "perception:calls", label: perceiver/calls}
  - {source: "perception:seconds", label: perceiver/seconds}
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("experiment-home")
    spec = home / "parsers.yaml"
    spec.write_text(EXPERIMENT)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBODIED_R_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        with prefect_test_harness(server_startup_timeout=120):
            import embodied_r.pipeline
            from embodied_r.experiments.spec import load_experiment
            from flows.experiment import experiment, plans, plans_to_json

            # The paper's tasks only, so that Object Recall is a family no variant trained on,
            # as in the demo.
            overrides = {"catalog": {"tasks": "paper"}, "training": {"max_steps_per_stage": 2},
                         "out_of_distribution": {"recall": {"catalog": {"tasks": ["Object Recall"]}}}}
            # As the command line starts it: every variant planned once, the plans handed down.
            planned = plans(load_experiment(str(spec)), "smoke", [3], overrides, home)
            made = []
            plan = embodied_r.pipeline.plan
            mp.setattr(embodied_r.pipeline, "plan", lambda *a, **k: made.append(1) or plan(*a, **k))
            result = experiment(name=str(spec), recipe="smoke", seeds=[3], overrides=overrides,
                                planned=plans_to_json(planned))
    return home, {**result, "plans_made_in_flow": len(made)}


def test_the_flow_plans_only_what_the_caller_could_not(ran) -> None:
    """The variants' plans come from the caller; the flow plans each out-of-distribution run
    (three models on one set), as it learns each model, and nothing again."""
    _, result = ran
    assert result["plans_made_in_flow"] == 3


def test_every_variant_is_evaluated_in_and_out_of_distribution(ran) -> None:
    _, result = ran
    got = {(c["variant"], c["evaluation"]) for c in result["cells"]}
    assert got == {(v, e) for v in ("grpo", "official-parser", "sft") for e in ("test", "recall")}
    assert all(c["seed"] == 3 for c in result["cells"])
    # Each set read against a guess on its own questions.
    assert all(0 < c["figures"]["chance"] < 1 for c in result["cells"])
    # The perceiver's time, from the stage run that perceived (found done for later variants).
    assert all(c["figures"]["perceiver/seconds"] > 0 for c in result["cells"])
    lines = "\n".join(result["lines"])
    assert "in distribution (the recipe's test split):" in lines and "out of distribution: recall:" in lines
    assert "Paired against grpo on the same questions" in lines
    for variant in ("official-parser", "sft"):
        for where in ("test", "recall"):
            assert f"  {variant} ({where}): pooled " in lines, lines


def test_the_variants_share_every_stage_they_have_in_common(ran) -> None:
    home, _ = ran
    stages = home / "stages"
    folders = {kind.name: sorted(p.name for p in kind.iterdir() if p.is_dir()) for kind in stages.iterdir()}
    # One training (the parser variant differs in its evaluation only; SFT trains apart).
    for kind in ("train_stage1", "train_stage2", "train_stage3"):
        assert len(folders[kind]) == 1, (kind, folders[kind])
    # The test split: twice (two parsers); the OOD family: three models, one catalog, one
    # perception and one set of records, made for the first and found done for the others.
    assert len(folders["evaluate"]) == 2 + 3, folders["evaluate"]
    assert len(folders["download"]) == 1
    for kind in ("preprocess", "keyframes", "perception", "convert"):
        assert len(folders[kind]) == 2, (kind, folders[kind])
    assert len(folders["sft"]) == 1 and len(folders["sft_evaluate"]) == 1
    assert "promote" not in folders  # an ablation moves no registry alias


def test_sft_trained_on_as_many_examples_as_grpo_made_completions(ran) -> None:
    from embodied_r.io import read_json

    home, result = ran
    (sft,) = [p for p in (home / "stages" / "sft").iterdir() if p.is_dir()]
    summary = read_json(sft / "summary.json")
    (cell,) = [c for c in result["cells"] if c["variant"] == "sft" and c["evaluation"] == "test"]
    (grpo,) = [c for c in result["cells"] if c["variant"] == "grpo" and c["evaluation"] == "test"]
    # Three stages of two steps, four completions a step (smoke: batch 4, one accumulation).
    assert grpo["figures"]["completions"] == cell["figures"]["completions"] == 24
    from embodied_r.config import load_recipe
    from flows.experiment import sft_settings

    cfg = sft_settings(load_recipe("smoke"), records=100, completions=24)
    per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    assert summary["steps"] == cfg.max_steps and cfg.max_steps * per_step >= 24 > (cfg.max_steps - 1) * per_step


def test_mlflow_holds_the_experiment_and_a_child_per_variant(ran) -> None:
    from mlflow import MlflowClient

    _, result = ran
    client = MlflowClient(tracking_uri=result["tracking_uri"])
    parent = client.get_run(result["mlflow_run_id"])
    assert parent.data.tags["experiment"] == "parsers" and parent.info.status == "FINISHED"
    assert "test/official-parser/paired/p_value" in parent.data.metrics
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_variant = {c.data.tags["variant"]: c for c in children}
    assert set(by_variant) == {"grpo", "official-parser", "sft"}
    for name, child in by_variant.items():
        assert child.data.tags["experiment"] == "parsers" and child.data.tags["seed"] == "3"
        assert {"test/accuracy", "recall/accuracy", "test/perceiver/calls"} <= set(child.data.metrics), name
        # The run that trained it is a run of the same store.
        assert client.get_run(child.data.tags["trained_by_run"]).info.status == "FINISHED"
    assert "test/paired/p_value" in by_variant["sft"].data.metrics
    assert "test/paired/p_value" not in by_variant["grpo"].data.metrics
    assert set(result["children"]) == {c.info.run_id for c in children}
    assert result["mlflow_compare_url"].startswith("http://127.0.0.1:5000/#/compare-runs?runs=")
    assert Path(result["table_file"]).read_text().startswith("Experiment parsers, recipe smoke, seeds 3:")


def test_the_compare_link_shows_the_variants_side_by_side_in_a_browser(ran) -> None:
    """The printed compare link opened in MLflow's own UI in headless Chromium: the three
    variants' runs in columns, with their per-set accuracy and paired p-value as rows."""
    import os
    import sys

    from tests.browser import Browser, ensure_chromium
    from tests.servers import background, free_port

    home, result = ran
    binary, why = ensure_chromium()
    if binary is None:
        pytest.skip(why)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with background([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                     result["tracking_uri"], "--host", "127.0.0.1", "--port", str(port)], home / "mlflow-ui.log",
                    dict(os.environ), ready_url=f"{base}/health", timeout=180):
        browser = Browser(binary, width=1600, height=1200)
        try:
            browser.open(result["mlflow_compare_url"].replace("http://127.0.0.1:5000", base))
            # The metrics table draws its first rows only (it scrolls): the first set's names.
            text = browser.wait_for("Comparing 3 Runs from 1 Experiment", "grpo seed 3", "official-parser seed 3",
                                    "sft seed 3", "recall/accuracy", "recall/paired/p_value", "test/accuracy")
            assert "variant" in text and "trained_by_run" in text
            browser.screenshot(Path(os.environ.get("EMBODIED_R_SCREENSHOTS") or home) / "mlflow-experiment-compare.png")
        finally:
            browser.close()
