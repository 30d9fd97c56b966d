"""The `released` recipe: the authors' checkpoints evaluated as the official code evaluated; it
validates anywhere, plans no training, and a run without the original texts stops first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodied_r.apps.cli import main
from embodied_r.config import backend_problems, load_recipe
from embodied_r.errors import RecipeError
from embodied_r.evaluation.released import HubFolder, parse_hub_folder
from embodied_r.pipeline import plan
from tests.prompts.test_prompts_import import imported


def test_it_validates_here_and_shows_its_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--recipe", "released", "--show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["evaluation"]["model"] == "hf://EmbodiedCity/Embodied-R/Weight_1"
    assert shown["evaluation"]["answer_parser"] == "official" and shown["evaluation"]["split"] == "test"
    backend = shown["evaluation"]["backend"]
    assert (backend["temperature"], backend["max_new_tokens"], backend["repetition_penalty"]) == (
        0.0, 3096, "generation_config")
    assert shown["catalog"]["split"]["rule"] == "pooled_scenes" and shown["keyframes"]["mode"] == "official"
    assert shown["perception"]["on_failure"] == "keep_placeholder"
    assert backend_problems(load_recipe("released")) == []


def test_its_plan_holds_only_what_evaluation_needs(tmp_path: Path) -> None:
    stages = plan(load_recipe("released"), tmp_path)
    assert list(stages) == ["download", "preprocess", "keyframes", "perception", "convert", "evaluate"]
    evaluate = stages["evaluate"]
    assert evaluate.deps == ("convert",) and evaluate.inputs["model"] == "hf://EmbodiedCity/Embodied-R/Weight_1"
    assert evaluate.config["max_prompt_length"] == 32768
    # The other weights are another evaluation folder; the stages before it are shared.
    other = plan(load_recipe("released", {"evaluation": {"model": "hf://EmbodiedCity/Embodied-R/Weight_2"}}), tmp_path)
    assert other["evaluate"].key != evaluate.key and other["convert"].key == stages["convert"].key
    # The paper recipe it extends still trains.
    assert [n for n in plan(load_recipe("paper"), tmp_path) if n.startswith("train_")] == [
        "train_stage1", "train_stage2", "train_stage3"]


def test_a_run_without_the_original_texts_stops_before_any_stage(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    recipe = load_recipe("released")
    problems = backend_problems(recipe, {"download", "perception", "evaluate"})
    assert len(problems) == 1 and problems[0].startswith("prompts.file:") and "import-official" in problems[0]
    assert backend_problems(recipe, {"evaluate"}) == []  # a run of the evaluation alone does not perceive
    # With the file (imported from a fixture checkout) nothing is missing.
    path = imported(tmp_path, capsys)
    with_texts = load_recipe("released", {"prompts": {"file": str(path)}})
    assert with_texts.perception.texts is not None and with_texts.prompts.source.startswith("official@")
    assert backend_problems(with_texts, {"perception"}) == []


def test_the_perception_stage_refuses_without_the_texts(tmp_path: Path) -> None:
    from embodied_r.perception.stage import run_perception

    cfg = load_recipe("released").perception
    with pytest.raises(ValueError, match="prompts file") as exc:
        run_perception(tmp_path / "catalog.parquet", tmp_path / "keyframes", tmp_path / "out", cfg)
    assert "\n" not in str(exc.value) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("ref, parsed", [
    ("hf://EmbodiedCity/Embodied-R/Weight_1", HubFolder("EmbodiedCity/Embodied-R", "Weight_1")),
    ("hf://o/r/a/b@0123abc", HubFolder("o/r", "a/b", "0123abc")),
])
def test_hub_folder_references(ref: str, parsed: HubFolder) -> None:
    assert parse_hub_folder(ref) == parsed


@pytest.mark.parametrize("ref", ["hf://EmbodiedCity/Embodied-R", "hf://o/r/w@", "EmbodiedCity/Embodied-R/Weight_1"])
def test_a_malformed_hub_folder_is_one_line_naming_the_form(ref: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_hub_folder(ref)
    assert ref in str(exc.value) and "\n" not in str(exc.value)


def test_a_given_model_is_never_promoted() -> None:
    with pytest.raises(RecipeError, match="tracking.promote: false"):
        load_recipe("released", {"tracking": {"promote": True}})


def test_the_other_recipes_evaluate_what_they_train() -> None:
    for name in ("demo", "paper", "official-script", "improved"):
        assert load_recipe(name).evaluation.model is None
