"""The GRPO settings declared once, the batch shape on any process count, and the resolved
settings of the paper and demo recipes pinned."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from embodied_r.config import load_recipe
from embodied_r.errors import RecipeError
from embodied_r.training.config import OWNED_GRPO_ARGS, TrainingConfig
from embodied_r.training.grpo import grpo_kwargs, stage_seed

PAPER_SETTINGS = {
    "adam_beta1": 0.9, "adam_beta2": 0.95, "beta": 0.001, "epsilon": 0.2, "gradient_accumulation_steps": 4,
    "learning_rate": 5e-07, "loss_type": "grpo", "lr_scheduler_type": "cosine", "max_completion_length": 2048,
    "max_grad_norm": 1.0, "num_generations": 8, "per_device_train_batch_size": 8, "repetition_penalty": 1.0,
    "scale_rewards": "group", "temperature": 1.0, "top_k": 50, "top_p": 0.9,
    "vllm_importance_sampling_correction": False, "warmup_steps": 0.05, "weight_decay": 0.1,
}

# Every name grpo_args could not override before the settings were declared once.
OWNED_BEFORE = {
    "adam_beta1", "adam_beta2", "beta", "epsilon", "epsilon_high", "gradient_accumulation_steps", "learning_rate",
    "loss_type", "lr_scheduler_type", "max_completion_length", "max_grad_norm", "max_steps", "num_generations",
    "num_train_epochs", "output_dir", "per_device_train_batch_size", "repetition_penalty", "report_to",
    "reward_weights", "run_name", "scale_rewards", "temperature", "top_k", "top_p", "use_cpu", "use_vllm",
    "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization", "vllm_importance_sampling_correction",
    "vllm_max_model_length", "vllm_mode", "vllm_server_base_url", "vllm_tensor_parallel_size", "warmup_ratio",
    "warmup_steps", "weight_decay",
}

DEMO_STAGE_KWARGS = {
    "output_dir": "/w/checkpoints", "use_cpu": True, "bf16": False, "fp16": False, "seed": 42, "logging_steps": 1,
    "save_steps": 50, "save_total_limit": 2, "save_only_model": False, "report_to": [], "disable_tqdm": True,
    "learning_rate": 0.0003, "beta": 0.001, "num_generations": 4, "max_completion_length": 64,
    "per_device_train_batch_size": 16, "gradient_accumulation_steps": 1, "temperature": 1.0, "top_p": 0.9,
    "top_k": 50, "repetition_penalty": 1.0, "loss_type": "grpo", "scale_rewards": "group", "epsilon": 0.2,
    "lr_scheduler_type": "cosine", "warmup_steps": 0.05, "weight_decay": 0.1, "adam_beta1": 0.9,
    "adam_beta2": 0.95, "max_grad_norm": 1.0, "vllm_importance_sampling_correction": False, "max_steps": -1,
    "reward_weights": [1.0], "log_completions": False,
}


def test_paper_grpo_settings_are_pinned() -> None:
    assert load_recipe("paper").training.grpo_settings() == PAPER_SETTINGS
    assert OWNED_GRPO_ARGS >= OWNED_BEFORE


def test_every_typed_setting_reaches_trl_and_is_owned() -> None:
    cfg = TrainingConfig(epsilon_high=0.28)
    settings = cfg.grpo_settings()
    assert settings["epsilon_high"] == 0.28 and "warmup_ratio" not in settings
    assert set(settings) <= OWNED_GRPO_ARGS
    with pytest.raises(ValidationError, match="grpo_args may not set beta"):
        TrainingConfig(grpo_args={"beta": 0.5})


def test_demo_trainer_arguments_are_unchanged() -> None:
    """The demo's figures come from these: any change to them changes the demo."""
    training = load_recipe("demo").training
    assert (training.stage_chain, training.prompt_cut, training.eval_steps) == ("fresh", "both", None)
    assert (training.policy, training.max_prompt_length, training.stage_seeds) == ("tiny:lm-reader", 160, "offset")
    # The paper's 2 : 2 : 8 epochs scaled to a quarter, a quarter and one pass, no step cap.
    for index, (stage, epochs) in enumerate(zip(training.stages, (0.25, 0.25, 1.0)), start=1):
        seeded = training.model_copy(update={"seed": stage_seed(training, index)})
        kwargs = grpo_kwargs(stage, seeded, Path("/w"), [1.0], [])
        kwargs.pop("activation_checkpointing", kwargs.pop("gradient_checkpointing", None))
        assert kwargs == {**DEMO_STAGE_KWARGS, "run_name": stage.name, "num_train_epochs": epochs, "seed": 41 + index}


def test_one_learning_rate_rule() -> None:
    with pytest.raises(ValidationError, match="learning_rate must be positive"):
        TrainingConfig(learning_rate=0.0)
    assert TrainingConfig(learning_rate=0.0, allow_zero_learning_rate=True).learning_rate == 0.0
    with pytest.raises(RecipeError, match="learning_rate must be positive"):
        load_recipe("smoke", {"training": {"learning_rate": 0}})


@pytest.mark.parametrize(("recipe", "world", "accumulation"), [
    ("paper", 1, 4), ("paper", 2, 2), ("paper", 4, 1), ("paper-8gpu", 8, 4), ("paper-5gpu", 4, 8),
    ("single-gpu", 1, 16), ("official-script-5gpu", 4, 4),
])
def test_completions_per_step_on_any_world(recipe: str, world: int, accumulation: int) -> None:
    training = load_recipe(recipe).training
    settings = training.grpo_settings(world)
    assert settings["gradient_accumulation_steps"] == accumulation
    per_step = world * settings["per_device_train_batch_size"] * accumulation
    assert per_step == training.completions_per_step


def test_a_world_that_does_not_divide_is_refused_with_the_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    training = load_recipe("paper").training  # accelerate without a config: the world is unknown here
    assert training.world() is None
    with pytest.raises(ValueError, match=r"completions_per_step = 32 cannot be made of 3 processes x "
                                         r"per_device_train_batch_size 8"):
        grpo_kwargs(training.stages[0], training, Path("/w"), [1.0], [], world=3)
    # Inside the launch (or wherever WORLD_SIZE is set) the recipe itself refuses.
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(RecipeError, match="3 processes"):
        load_recipe("paper")


def test_accumulation_given_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="exactly one of training.completions_per_step"):
        TrainingConfig(completions_per_step=32, gradient_accumulation_steps=4)


def test_trainer_gets_validation_and_best_checkpoint_settings() -> None:
    training = load_recipe("paper").training
    assert (training.eval_steps, training.save_steps, training.save_total_limit) == (100, 100, 200)
    kwargs = grpo_kwargs(training.stages[0], training, Path("/w"), [1.0], [])
    assert (kwargs["eval_strategy"], kwargs["eval_steps"]) == ("steps", 100)
    assert "metric_for_best_model" not in kwargs
    improved = load_recipe("improved").training
    kwargs = grpo_kwargs(improved.stages[0], improved, Path("/w"), [1.0], [])
    assert kwargs["metric_for_best_model"] == "eval_rewards/accuracy_reward/mean" and kwargs["greater_is_better"]
    with pytest.raises(ValidationError, match="keep_best picks a checkpoint by validation"):
        TrainingConfig(keep_best=True)


def test_chain_and_prompt_rule_per_recipe() -> None:
    assert {n: (load_recipe(n).training.stage_chain, load_recipe(n).training.prompt_cut)
            for n in ("paper", "official-script", "official-script-5gpu", "improved")} == {
        "paper": ("resume", "rollout_only"), "official-script": ("resume", "rollout_only"),
        "official-script-5gpu": ("resume", "rollout_only"), "improved": ("fresh", "both")}
    with pytest.raises(ValidationError, match="save_only_model: false"):
        TrainingConfig(stage_chain="resume", save_only_model=True)


def test_the_plan_keys_the_chain_and_hands_evaluation_the_chosen_checkpoint(tmp_path: Path) -> None:
    from embodied_r.pipeline import plan

    paper = plan(load_recipe("paper"), tmp_path)
    fresh = plan(load_recipe("paper", {"training": {"stage_chain": "fresh"}}), tmp_path)
    assert paper["train_stage1"].key != fresh["train_stage1"].key
    # Under resume each stage's schedule spans every stage: the stage is handed them all.
    assert [s["name"] for s in paper["train_stage1"].config["chain"]] == ["stage1", "stage2", "stage3"]
    assert "chain" not in fresh["train_stage1"].config
    assert paper["evaluate"].inputs["model"] == str(Path(paper["train_stage3"].out) / "model")
    best = plan(load_recipe("improved", {"evaluation": {"checkpoint": "best_val"}}), tmp_path)
    assert best["evaluate"].inputs["model"] == str(Path(best["train_stage3"].out) / "best_model")
    with pytest.raises(RecipeError, match="set training.keep_best: true"):
        load_recipe("paper", {"evaluation": {"checkpoint": "best_val"}})


def test_stage_seeds_offset_gives_each_stage_its_own_draw():
    """``stage_seeds: offset``: stage i trains with seed + i - 1, so a stage cut short by the step
    cap draws other questions than the one before; ``same`` (the paper recipes) keeps one seed."""
    from embodied_r.training.config import TrainingConfig
    from embodied_r.training.grpo import stage_seed

    same = TrainingConfig(seed=42)
    offset = TrainingConfig(seed=42, stage_seeds="offset")
    assert [stage_seed(same, i) for i in (1, 2, 3)] == [42, 42, 42]
    assert [stage_seed(offset, i) for i in (1, 2, 3)] == [42, 43, 44]
