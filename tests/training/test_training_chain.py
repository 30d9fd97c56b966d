"""On the CPU with the tiny LM: the rollout-only prompt cut, stages chained by resuming the
previous one's optimizer and schedule, and validation with the best checkpoint kept."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from embodied_r.backends.base import BackendConfig
from embodied_r.training.config import GRPOStageConfig, TrainingConfig
from embodied_r.training.stage import run_training_stage
from tests.stage_inputs import build_records, catalog_row

STAGES = [GRPOStageConfig(name="s1", rewards={"format": 0.7, "accuracy": 0.3}),
          GRPOStageConfig(name="s2", rewards={"format": 0.3, "accuracy": 0.7})]


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [catalog_row(f"urbanvideo:{i}", "train", answer="ABCD"[i % 4]) for i in range(8)]
    rows += [catalog_row(f"urbanvideo:{i}", "val", answer="ABCD"[i % 4]) for i in range(20, 22)]
    return build_records(tmp_path_factory.mktemp("chain_records"), rows)


def cfg(**kw: Any) -> TrainingConfig:
    base: dict[str, Any] = dict(
        policy="tiny:lm", reference=BackendConfig(model="tiny:lm", device="cpu", max_new_tokens=4),
        num_generations=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
        max_completion_length=8, max_steps_per_stage=1, use_cpu=True, gradient_checkpointing=False,
        learning_rate=1e-3, warmup_ratio=0.0, save_steps=50, stages=STAGES, completion_table_rows=0,
    )
    base.update(kw)
    return TrainingConfig(**base)


def tiny_grpo_args(output_dir: str, **more: Any) -> Any:
    """TRL's GRPOConfig for a trainer built here, checkpointing under the name the installed
    transformers asks for (TRL's default for the old one warns)."""
    from trl import GRPOConfig

    from embodied_r.training.trl_args import field_name

    return GRPOConfig(output_dir=output_dir, use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, report_to=[], bf16=False,
                      **{field_name(GRPOConfig, "gradient_checkpointing"): False}, **more)


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer runs in this process: the child's start-up (imports) would cost most of
    the test's time. Everything else is the stage's own path."""
    from embodied_r.io import read_json, write_json_atomic
    from embodied_r.training import grpo, stage
    from embodied_r.training.environment import RESULT_NAME, SPEC_NAME

    def run_here(module: str, spec: dict[str, Any], work: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        write_json_atomic(work / SPEC_NAME, spec)
        assert grpo.main(str(work / SPEC_NAME)) == 0
        return read_json(work / RESULT_NAME)

    monkeypatch.setattr(stage, "run_child", run_here)


def test_rollout_only_cuts_the_generation_prompt_and_not_the_loss(tiny_lm_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """ms-swift 3.3's rule: generation sees the last max_prompt_length tokens, the loss and
    KL pass the whole prompt."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from embodied_r.training.chain import trainer_class

    seen: list[int] = []
    original = GRPOTrainer._generate_single_turn

    def recording(self: Any, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
        seen.extend(len(ids) for ids in prompt_ids)
        return original(self, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", recording)
    long = [{"role": "user", "content": "x " * 300 + "QUESTION?"}]
    data = Dataset.from_list([{"prompt": long}, {"prompt": long}])
    args = tiny_grpo_args("/tmp/unused")
    trainer = trainer_class(64, None)(model=str(tiny_lm_path), reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                                      args=args, train_dataset=data)
    batch = trainer._generate_and_score_completions([{"prompt": long}, {"prompt": long}])
    whole = int(batch["prompt_mask"].sum(dim=1).max())
    assert whole > 300  # the loss sees the whole prompt ...
    assert seen and max(seen) == 64  # ... generation its last 64 tokens


def test_cpu_rollouts_draw_the_same_tokens_without_autograd_and_train_after(tiny_lm_path: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU the trainer samples under inference mode: the same tokens as TRL's own no_grad
    rollout at the same seed, and nothing of it reaches the backward pass."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from embodied_r.training.chain import trainer_class

    modes: list[bool] = []
    original = GRPOTrainer._generate_single_turn

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        modes.append(torch.is_inference_mode_enabled())
        return original(self, *args, **kwargs)

    prompt = [{"role": "user", "content": "Where is the red cube? " * 3}]
    args = tiny_grpo_args(str(tmp_path), max_steps=2, logging_steps=1, save_strategy="no")
    def longer_is_better(completions: list[Any], **kw: Any) -> list[float]:
        return [float(len(str(c))) for c in completions]

    trainer = trainer_class(None, None)(model=str(tiny_lm_path), args=args, reward_funcs=[longer_is_better],
                                        train_dataset=Dataset.from_list([{"prompt": prompt}] * 4))
    prompt_ids = [trainer.processing_class.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                               return_dict=True)["input_ids"]] * 4
    torch.manual_seed(0)
    theirs = original(trainer, prompt_ids, None, {}, 2)[0]
    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", recording)
    torch.manual_seed(0)
    ours = trainer._generate_single_turn(prompt_ids, None, {}, 2)[0]
    assert modes == [True] and ours == theirs and any(ours)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def chained_policy(initial: str, state: str, tmp_path: Path) -> dict[str, Any]:
    """The policy's weights of a trainer built from ``initial`` once the chain state is loaded."""
    from datasets import Dataset

    from embodied_r.training.chain import load_chain_weights, trainer_class

    args = tiny_grpo_args(str(tmp_path / "unused"))
    trainer = trainer_class(None, None)(model=initial, args=args, train_dataset=Dataset.from_list([{"prompt": "x"}] * 2),
                                        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)])
    load_chain_weights(trainer, state)
    return {k: v.detach() for k, v in trainer.model.state_dict().items()}


def test_resume_chain_carries_optimizer_and_schedule(records: Path, tmp_path: Path, in_process: None) -> None:
    chain = cfg(stage_chain="resume")
    first = run_training_stage(records, "tiny:lm", tmp_path / "s1", STAGES[0], chain, chain=STAGES)
    second = run_training_stage(records, str(tmp_path / "s1" / "model"), tmp_path / "s2", STAGES[1], chain,
                                chain=STAGES)
    # One cosine over both stages' 2 steps, no warm-up: 1e-3, then half of it after a step.
    assert first["schedule_steps"] == second["schedule_steps"] == 2
    assert first["first_learning_rate"] == pytest.approx(1e-3)
    assert first["last_learning_rate"] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert second["first_learning_rate"] == pytest.approx(first["last_learning_rate"])
    # Adam's state came along: its step count goes on from the first stage's step.
    assert (first["first_adam_step"], second["first_adam_step"]) == (0, 1) and second["chain_loaded"]
    # As ms-swift 3.3's resume of a full-parameter run: the policy and the KL reference (TRL
    # builds it from the policy's model id) are the previous stage's weights.
    assert second["reference_model"] == str(tmp_path / "s1" / "model")
    assert second["chain_initial_model"] == first["chain_initial_model"] == first["init_model"]
    assert first["chain_state"] == str(tmp_path / "s1" / "chain_state") and Path(first["chain_state"]).is_dir()
    # Built on the initial weights (a LoRA chain's base), the policy takes the kept state's
    # trained weights, not the initial ones.
    started = chained_policy(first["init_model"], first["chain_state"], tmp_path)
    trained = load_file(tmp_path / "s1" / "model" / "model.safetensors")
    initial = load_file(Path(first["init_model"]) / "model.safetensors")
    assert any(not torch.equal(initial[k], v) for k, v in trained.items())
    assert all(torch.equal(started[k], v) for k, v in trained.items() if k in started)

    fresh = cfg(stage_chain="fresh")
    again = run_training_stage(records, str(tmp_path / "s1" / "model"), tmp_path / "f2", STAGES[1], fresh)
    assert again["first_learning_rate"] == pytest.approx(1e-3) and again["first_adam_step"] == 0
    assert again["chain_state"] is None and not again["chain_loaded"]


def test_validation_every_n_steps_keeps_the_best_checkpoint(records: Path, tmp_path: Path, in_process: None) -> None:
    training = cfg(eval_steps=1, keep_best=True, save_steps=1, save_total_limit=1, max_steps_per_stage=2)
    summary = run_training_stage(records, "tiny:lm", tmp_path / "s1", STAGES[0], training)
    history = json.loads((tmp_path / "s1" / "history.json").read_text())["history"]
    evals = [e for e in history if "eval_rewards/accuracy_reward/mean" in e]
    assert [e["step"] for e in evals] == [1, 2]
    best = max(evals, key=lambda e: e["eval_rewards/accuracy_reward/mean"])
    assert summary["best_metric"] == pytest.approx(best["eval_rewards/accuracy_reward/mean"])
    assert summary["best_checkpoint"] == f"checkpoint-{best['step']}"
    assert summary["best_model"] == str(tmp_path / "s1" / "best_model")
    # A model folder evaluation loads as it is: weights, config and tokenizer.
    assert all((tmp_path / "s1" / "best_model" / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))
    assert not (tmp_path / "s1" / "best_model" / "optimizer.pt").exists()


def test_the_chain_schedule_never_ends_before_the_trainer_does(tiny_lm_path: Path) -> None:
    """Planned from record counts, the chain's length can fall short of the steps the trainer
    counts: the cosine then still ends at the last step instead of rising again."""
    from datasets import Dataset

    from embodied_r.training.chain import trainer_class

    args = tiny_grpo_args("/tmp/unused", lr_scheduler_type="cosine", warmup_steps=0)
    trainer = trainer_class(None, 4, 3)(model=str(tiny_lm_path), args=args,
                                        train_dataset=Dataset.from_list([{"prompt": "x"}] * 2),
                                        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)])
    trainer.create_optimizer()
    scheduler = trainer.create_scheduler(5)  # 3 steps before + 5 here: 8, not the planned 4
    assert scheduler.lr_lambdas[0](4) == pytest.approx(0.5)
