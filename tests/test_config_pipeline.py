"""Recipes, the stage graph and its cache keys, and what reaches MLflow."""

from pathlib import Path

import pytest

from embodied_r.config import available_recipes, load_recipe, parse_override
from embodied_r.errors import RecipeError, StageError
from embodied_r.pipeline import plan
from embodied_r.tracking.names import numeric_metrics, safe_params
from embodied_r.tracking.runs import Tracker


def test_shipped_recipes_validate():
    assert {"demo", "paper"} <= set(available_recipes())
    for name in available_recipes():
        assert load_recipe(name).name == name


def test_paper_recipe_has_the_papers_values():
    r = load_recipe("paper")
    assert r.catalog.tasks == "paper"
    assert (r.catalog.split.train, r.catalog.split.val, r.catalog.split.test) == (0.75, 0.05, 0.20)
    k = r.keyframes
    assert (k.sample_fps, k.ransac_reproj_threshold, k.overlap_threshold, k.min_frames, k.max_frames) == \
        (1.0, 5.0, 0.5, 4, 32)
    assert r.perception.backend.model == "Qwen/Qwen2.5-VL-72B-Instruct"
    # Full-resolution frames, as the official code sent them: a 720p frame is not shrunk.
    assert (k.jpeg_max_side, k.jpeg_quality) == (0, 95) and r.perception.backend.max_pixels >= 1920 * 1080
    assert (r.perception.reply_format, r.perception.image_order, r.perception.max_new_tokens) == (
        "numbered", "text_first", 4096)
    t = r.training
    assert (t.learning_rate, t.beta, t.num_generations, t.max_completion_length) == (5e-7, 0.001, 8, 2048)
    assert [s.rewards for s in t.stages] == [{"format": 0.7, "accuracy": 0.3, "consistency": 0.0},
                                             {"format": 0.3, "accuracy": 0.7, "consistency": 0.0},
                                             {"format": 0.1, "accuracy": 0.7, "consistency": 0.2}]
    assert [s.epochs for s in t.stages] == [2, 2, 8]
    assert t.reference.model == "Qwen/Qwen2.5-VL-3B-Instruct"


def test_recipe_errors_name_the_fix(tmp_path):
    with pytest.raises(RecipeError, match="choose one of"):
        load_recipe("no-such-recipe")
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: smoke\ntraining:\n  learning_rat: 1\n")
    with pytest.raises(RecipeError, match="learning_rat"):
        load_recipe(bad)
    child = tmp_path / "child.yaml"
    child.write_text("extends: smoke\nname: child\ntraining:\n  learning_rate: 3.0e-6\n")
    r = load_recipe(child)
    assert r.training.learning_rate == 3e-6 and r.training.policy == "tiny:lm"
    assert parse_override("training.beta=0.01") == {"training": {"beta": 0.01}}


def test_changing_a_stage_changes_its_key_and_its_dependants_only(tmp_path):
    base = plan(load_recipe("smoke"), tmp_path)
    changed = plan(load_recipe("smoke", {"perception": {"max_new_tokens": 7}}), tmp_path)
    differs = [n for n in base if base[n].key != changed[n].key]
    assert differs == base.downstream(["perception"])
    assert differs[0] == "perception" and "keyframes" not in differs and differs[-2:] == ["evaluate", "promote"]
    assert changed["train_stage2"].inputs["init_model"] == str(Path(changed["train_stage1"].out) / "model")


def test_a_stage_alone_needs_its_inputs(tmp_path):
    stages = plan(load_recipe("smoke"), tmp_path)
    with pytest.raises(StageError, match="embodied-r preprocess --recipe smoke"):
        stages.select(["keyframes"])
    assert stages.select(["download", "preprocess"]) == ["download", "preprocess"]
    with pytest.raises(StageError, match="unknown stage"):
        stages.select(["nope"])


def test_secrets_never_become_params():
    params = safe_params({"backend": {"api_key": "sk-secret", "api_key_env": "OPENAI_API_KEY",
                                      "hf_token": "hf_x", "model": "m"}})
    assert params == {"backend.api_key_env": "OPENAI_API_KEY", "backend.model": "m"}
    assert numeric_metrics({"a": 1, "b": {"c": 2.5}, "d": "x", "e": True, "f": float("nan")}) == \
        {"a": 1.0, "b/c": 2.5}


def test_tracker_writes_parent_and_child_runs_to_a_real_store(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker.open("exp", uri, tmp_path).start_parent("p", {"recipe": "x"}, {"a": {"b": 1}})
    child = tracker.start_stage("keyframes", {"sample_fps": 1.0})
    (tmp_path / "summary.json").write_text("{}")
    tracker.log_metrics(child, {"keyframes_mean": 5.0})
    tracker.log_artifacts(child, [tmp_path / "summary.json"])
    tracker.finish(child)
    run = MlflowClient(uri).get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == tracker.parent_run_id
    assert run.data.params == {"sample_fps": "1.0"} and run.data.metrics == {"keyframes_mean": 5.0}
    assert run.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())
    assert [a.path for a in MlflowClient(uri).list_artifacts(child)] == ["summary.json"]


# Promotion reads the evaluation: what re-keys evaluate re-keys it.
TRAIN_AND_AFTER = ["train_stage1", "train_stage2", "train_stage3", "evaluate", "promote"]


@pytest.mark.parametrize("module, changed", [
    # The MRA thresholds: the accuracy reward (the trainer child) and evaluation score with them.
    ("embodied_r.scoring.metrics", TRAIN_AND_AFTER),
    # The trainer child alone, started as `python -m embodied_r.training.grpo`, not imported.
    ("embodied_r.training.grpo", TRAIN_AND_AFTER),
    ("embodied_r.scoring.answers", ["convert", *TRAIN_AND_AFTER]),
    ("embodied_r.keyframes.extract", ["keyframes", "perception", "convert", *TRAIN_AND_AFTER]),
    ("embodied_r.perception.prompts", ["perception", "convert", *TRAIN_AND_AFTER]),
    ("embodied_r.evaluation.report", ["evaluate", "promote"]),
    ("embodied_r.synthetic.urban", ["download", "preprocess", "keyframes", "perception", "convert",
                                    *TRAIN_AND_AFTER]),
    ("embodied_r.data.catalog", ["preprocess", "keyframes", "perception", "convert", *TRAIN_AND_AFTER]),
    # Demo code the backends reach by name keys the stages whose config names it: the smoke
    # recipe's models are tiny:vlm and tiny:lm, its perceiver no `kind: world`.
    ("embodied_r.demo.world_perceiver", []),
    ("embodied_r.demo.tiny_models", ["perception", "convert", *TRAIN_AND_AFTER]),
    # No stage runs the CLI or the SFT baseline: editing them recomputes nothing.
    ("embodied_r.apps.cli", []),
    ("embodied_r.training.sft_child", []),
])
def test_changing_a_module_changes_the_keys_of_the_stages_that_run_it_and_after(tmp_path, monkeypatch,
                                                                                module, changed):
    from embodied_r import code_keys

    recipe = load_recipe("smoke")
    base = plan(recipe, tmp_path)
    real = code_keys.module_version

    def edited(name: str) -> str:
        full = name if name.startswith("embodied_r") else f"embodied_r.{name}"
        return "edited" if full == module else real(name)

    monkeypatch.setattr(code_keys, "module_version", edited)
    after = plan(recipe, tmp_path)
    assert [n for n in base if base[n].key != after[n].key] == changed


def test_every_evaluation_of_the_reasoner_cuts_prompts_as_training_does(tmp_path):
    """The pipeline's evaluations and the ones outside it (promotion, eval-model, baselines)
    take one config, ``Recipe.evaluation_settings``: prompts cut to training's limit, so a
    model trained on the last 160 tokens is never asked with whole prompts."""
    recipe = load_recipe("demo")
    assert recipe.training.max_prompt_length == 160
    assert recipe.evaluation.max_prompt_length is None
    assert recipe.evaluation_settings().max_prompt_length == 160
    stages = plan(recipe, tmp_path)
    assert {stages[n].config["max_prompt_length"] for n in stages if stages[n].kind == "evaluate"} == {160}
    own = load_recipe("demo", {"evaluation": {"max_prompt_length": 99}})
    assert own.evaluation_settings().max_prompt_length == 99
