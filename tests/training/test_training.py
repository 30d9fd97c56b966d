"""GRPO stages on the CPU with the tiny LM: chained, resumed, tracked."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from embodied_r.backends.base import BackendConfig
from embodied_r.io import partial_path
from embodied_r.tracking.names import stage_metrics
from embodied_r.training.config import GRPOStageConfig, TrainingConfig, VLLMRollouts
from embodied_r.training.environment import PROJECT_ROOT, LoraSettings
from embodied_r.training.stage import run_training_stage
from tests.stage_inputs import build_records, catalog_row


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [catalog_row(f"urbanvideo:{i}", "train", answer="ABCD"[i % 4]) for i in range(8)]
    rows.append(catalog_row("urbanvideo:99", "test"))
    return build_records(tmp_path_factory.mktemp("train_records"), rows)


def tiny_cfg(stages: list[GRPOStageConfig], reference: str = "tiny:lm", **kw: object) -> TrainingConfig:
    base = dict(
        policy="tiny:lm",
        reference=BackendConfig(model=reference, device="cpu", max_new_tokens=4),
        num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        max_completion_length=16, max_steps_per_stage=2, use_cpu=True, gradient_checkpointing=False,
        learning_rate=1e-4, save_steps=50, stages=stages, completion_table_rows=2, completion_table_steps=50,
    )
    base.update(kw)
    return TrainingConfig(**base)


def test_defaults_are_the_papers() -> None:
    cfg = TrainingConfig()
    assert [s.epochs for s in cfg.stages] == [2, 2, 8]
    assert [s.rewards for s in cfg.stages] == [{"format": 0.7, "accuracy": 0.3, "consistency": 0.0},
                                               {"format": 0.3, "accuracy": 0.7, "consistency": 0.0},
                                               {"format": 0.1, "accuracy": 0.7, "consistency": 0.2}]
    assert (cfg.learning_rate, cfg.beta, cfg.num_generations, cfg.max_completion_length) == (5e-7, 0.001, 8, 2048)
    assert cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps % cfg.num_generations == 0


def test_bad_configs_fail_at_once() -> None:
    with pytest.raises(ValueError, match="divisible by num_generations"):
        TrainingConfig(num_generations=8, per_device_train_batch_size=3, gradient_accumulation_steps=1)
    with pytest.raises(ValueError, match="reward weight"):
        GRPOStageConfig(name="x", rewards={"format": 0.0})
    with pytest.raises(ValueError):
        TrainingConfig(learning_rat=1e-6)


def test_config_refuses_what_it_would_silently_ignore(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="use the typed training fields"):
        TrainingConfig(grpo_args={"use_vllm": True})
    with pytest.raises(ValueError, match="launcher: accelerate"):
        TrainingConfig(accelerate_config="infra/training/accelerate-zero3-8gpu.yaml")
    with pytest.raises(ValueError, match="not found"):
        TrainingConfig(launcher="accelerate", accelerate_config=str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="need a GPU"):
        TrainingConfig(use_cpu=True, vllm=VLLMRollouts())
    with pytest.raises(ValueError, match="ZeRO-3"):
        TrainingConfig(launcher="accelerate", accelerate_config="infra/training/accelerate-zero3-8gpu.yaml",
                       per_device_train_batch_size=1, lora=LoraSettings())
    # 8 processes x 1 x 3 = 24 completions: not whole groups of 16.
    with pytest.raises(ValueError, match="processes x per_device"):
        TrainingConfig(launcher="accelerate", accelerate_config="infra/training/accelerate-zero3-8gpu.yaml",
                       per_device_train_batch_size=1, gradient_accumulation_steps=3, num_generations=16)


def test_launch_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    spec = tmp_path / "spec.json"
    assert TrainingConfig().command("embodied_r.training.grpo", spec) == [
        sys.executable, "-m", "embodied_r.training.grpo", str(spec)]
    # From any working folder, the accelerate config is found in the checkout, and the
    # DeepSpeed file it names is passed as an absolute path beside it.
    monkeypatch.chdir(tmp_path)
    cfg = TrainingConfig(launcher="accelerate", accelerate_config="infra/training/accelerate-zero3-8gpu.yaml",
                         per_device_train_batch_size=1)
    cmd = cfg.command("embodied_r.training.grpo", spec)
    infra = PROJECT_ROOT / "infra" / "training"
    assert cmd[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert cmd[cmd.index("--config_file") + 1] == str(infra / "accelerate-zero3-8gpu.yaml")
    assert cmd[cmd.index("--deepspeed_config_file") + 1] == str(infra / "deepspeed-zero3.json")
    assert cmd[-3:] == ["-m", "embodied_r.training.grpo", str(spec)]
    # A training environment of its own: named, or from the environment.
    with pytest.raises(FileNotFoundError, match="training interpreter"):
        TrainingConfig(python=str(tmp_path / "no-env" / "bin" / "python")).command("m", spec)
    monkeypatch.setenv("EMBODIED_R_TRAIN_PYTHON", sys.executable)
    assert TrainingConfig().interpreter() == shutil.which(sys.executable)


def test_missing_inputs_name_the_fix(records: Path, tmp_path: Path) -> None:
    stage = GRPOStageConfig(name="s", rewards={"format": 1.0})
    with pytest.raises(FileNotFoundError, match="convert"):
        run_training_stage(tmp_path / "nothing", "tiny:lm", tmp_path / "out", stage, tiny_cfg([stage]))
    with pytest.raises(FileNotFoundError, match="config.json"):
        run_training_stage(records, str(tmp_path), tmp_path / "out", stage, tiny_cfg([stage]))


def test_reward_weights_reach_the_trainer(records: Path, tmp_path: Path, tiny_lm_path: Path) -> None:
    from trl import GRPOTrainer

    from embodied_r.training.grpo import grpo_args, load_dataset, reward_setup

    with_ref = GRPOStageConfig(name="s3", rewards={"format": 0.1, "accuracy": 0.7, "consistency": 0.2})
    without = GRPOStageConfig(name="s1", rewards={"format": 0.7, "accuracy": 0.3, "consistency": 0.0})
    cfg = tiny_cfg([with_ref])
    funcs, weights = reward_setup(with_ref, cfg)
    trainer = GRPOTrainer(model=str(tiny_lm_path), reward_funcs=funcs,
                          args=grpo_args(with_ref, cfg, tmp_path, weights, []), train_dataset=load_dataset(records))
    assert trainer.reward_weights.tolist() == pytest.approx([0.1, 0.7, 0.2])
    assert trainer.reward_func_names == ["format_reward", "accuracy_reward", "consistency_reward"]
    assert funcs[2]._backend is None  # the reference loads on first use, not before

    # A zero weight leaves the reward out: its reference is never built.
    funcs, weights = reward_setup(without, cfg)
    assert [f.__name__ for f in funcs] == ["format_reward", "accuracy_reward"] and weights == [0.7, 0.3]


def test_a_reward_is_one_table_entry_named_by_the_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from embodied_r.scoring.reward_table import REWARDS, Reward
    from embodied_r.training.grpo import reward_setup

    def brevity_reward(completions: list[str], **kwargs: object) -> list[float]:
        return [1.0 / (1 + len(c)) for c in completions]

    monkeypatch.setitem(REWARDS, "brevity", Reward(lambda run: brevity_reward))
    stage = GRPOStageConfig(name="s", rewards={"brevity": 0.4, "accuracy": 0.6, "format": 0.0})
    # The table's order, whatever order the stage lists them in; weight 0 leaves a reward out.
    assert list(stage.rewards) == ["format", "accuracy", "brevity"]
    funcs, weights = reward_setup(stage, tiny_cfg([stage]))
    assert [f.__name__ for f in funcs] == ["accuracy_reward", "brevity_reward"] and weights == [0.6, 0.4]


@pytest.mark.parametrize("stage, says", [
    ({"name": "s", "rewards": {"format": 0.7, "acuracy": 0.3}},
     "training.stages.0.rewards: stage 's': unknown reward 'acuracy'; the rewards are format, accuracy, consistency"),
    ({"name": "s", "format_weight": 0.7, "accuracy_weight": 0.3},
     "training.stages.0: stage 's': write rewards: {format: 0.7, accuracy: 0.3} in place of format_weight, "
     "accuracy_weight"),
    ({"name": "s", "rewards": {"format": -0.7, "accuracy": 0.3}},
     "training.stages.0.rewards.format: Input should be greater than or equal to 0"),
    ({"name": "s", "rewards": {"format": 0.0}}, "stage 's': at least one reward weight must be positive"),
    ({"name": "s"}, "training.stages.0.rewards: Field required"),
])
def test_a_wrong_reward_is_one_line_naming_it_and_the_fix(stage: dict, says: str) -> None:
    from embodied_r.config import load_recipe
    from embodied_r.errors import RecipeError

    with pytest.raises(RecipeError) as err:
        load_recipe("smoke", {"training": {"stages": [stage]}})
    assert says in str(err.value) and "\n" not in str(err.value)


def test_three_stages_chain_on_cpu(records: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("t", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id

    stages = [
        GRPOStageConfig(name="stage1", epochs=1, rewards={"format": 0.7, "accuracy": 0.3}),
        GRPOStageConfig(name="stage2", epochs=1, rewards={"format": 0.3, "accuracy": 0.7}),
        GRPOStageConfig(name="stage3", epochs=1, rewards={"format": 0.1, "accuracy": 0.7, "consistency": 0.2}),
    ]
    cfg = tiny_cfg(stages)
    model, summaries = "tiny:lm", []
    for i, stage in enumerate(stages):
        out = tmp_path / stage.name
        summary = run_training_stage(records, model, out, stage, cfg, mlflow_run_id=run_id if i == 0 else None)
        summaries.append(summary)
        assert summary["steps"] == 2 and summary["steps_this_run"] == 2
        assert summary["seconds_per_step"] == pytest.approx(summary["seconds"] / 2, abs=1e-3)
        assert (out / "model" / "config.json").is_file() and (out / "model" / "tokenizer.json").is_file()
        assert not (out / "checkpoints").exists() and not partial_path(out).exists()
        assert json.loads((out / "summary.json").read_text()) == summary
        # Every argument by the name the installed libraries ask for: no deprecation in the log.
        assert not re.search(r"(Future|Deprecation)Warning", (out / "train.log").read_text())
        if i:
            assert summary["init_model"] == str(tmp_path / stages[i - 1].name / "model")
        model = str(out / "model")
        print(f"{stage.name}: {summary['seconds_per_step']} s/step, {summary['seconds']} s")

    assert summaries[0]["reward_weights"] == [0.7, 0.3]
    assert summaries[2]["reward_funcs"] == ["format_reward", "accuracy_reward", "consistency_reward"]
    assert summaries[2]["reward_weights"] == [0.1, 0.7, 0.2]
    for key in ("final_rewards_format_reward_mean", "final_rewards_accuracy_reward_mean", "final_kl"):
        assert key in summaries[0]
    assert "final_rewards_consistency_reward_mean" in summaries[2]

    # The trainer logged its per-step figures into the given run.
    for name in ("reward/format", "reward/accuracy", "reward/format_std", "train/kl", "reward/total",
                 "train/completions/mean_length", "train/completions/max_length",
                 "train/completions/clipped_ratio", "train/entropy", "timing/step_time"):
        assert len(client.get_metric_history(run_id, name)) == 2, name
    # The run page lists its chart groups alphabetically: a training run opens on its rewards.
    names = set(client.get_run(run_id).data.metrics) | set(stage_metrics(summaries[0]))
    assert min(name.split("/", 1)[0] for name in names) == "reward", sorted(names)
    assert summaries[0]["stopped_by"] == "step cap" and summaries[0]["epochs_requested"] == 1.0
    assert [s["global_step_offset"] for s in summaries] == [0, 2, 4]
    # ... and a sample of completions as a table: one per table interval and the last step.
    table_path = client.download_artifacts(run_id, "completions.json", str(tmp_path / "dl"))
    table = json.loads(Path(table_path).read_text())
    columns = table["columns"]
    for column in ("step", "prompt", "completion", "format_reward", "accuracy_reward", "advantage",
                   "answer", "solution"):
        assert column in columns, column
    rows = [dict(zip(columns, row)) for row in table["data"]]
    assert sorted({r["step"] for r in rows}) == [1, 2] and {r["stage"] for r in rows} == {"train_stage1"}
    assert all(r["solution"] in "ABCD" and len(r["prompt"]) <= 401 for r in rows)
    assert "<answer>" in rows[0]["prompt"]  # the excerpt is the prompt's end: question and format
    assert summaries[0]["completion_tables"] == 2
    # Time split of the steps: generation was timed by the trainer's own phase, so the
    # update (the rest) is less than the whole (the split itself: test_phase_timer_...).
    split = [summaries[0][k] for k in ("seconds_generation", "seconds_reward", "seconds_update")]
    assert split[0] > 0 and split[1] >= 0 and split[2] < summaries[0]["seconds"]

    # A finished stage is not retrained.
    log = tmp_path / "stage1" / "train.log"
    before = log.stat().st_mtime_ns
    assert run_training_stage(records, "tiny:lm", tmp_path / "stage1", stages[0], cfg) == summaries[0]
    assert log.stat().st_mtime_ns == before


def test_crashed_stage_resumes_from_its_checkpoint(records: Path, tmp_path: Path) -> None:
    stage = GRPOStageConfig(name="s", rewards={"format": 0.5, "accuracy": 0.5})
    out = tmp_path / "stage"
    first = run_training_stage(records, "tiny:lm", out, stage,
                               tiny_cfg([stage], max_steps_per_stage=2, save_steps=2, keep_checkpoints=True))
    assert first["steps"] == 2
    # Put the folder back the way a kill after the step-2 checkpoint leaves it.
    partial = partial_path(out)
    out.rename(partial)
    for name in ("summary.json", "train_result.json"):
        (partial / name).unlink()
    shutil.rmtree(partial / "model")
    assert (partial / "checkpoints" / "checkpoint-2").is_dir()

    resumed = run_training_stage(records, "tiny:lm", out, stage, tiny_cfg([stage], max_steps_per_stage=3))
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 3 and resumed["steps_this_run"] == 1
    assert (out / "model" / "config.json").is_file()


def test_phase_timer_splits_a_step_into_its_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock that the phases themselves move: generation 2 s, scoring 3 s twice; then
    the first and the last optimizer step's own split."""
    from embodied_r.training import timing

    clock = [100.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

    class Trainer:
        def _generate(self, n: int) -> int:
            clock[0] += 2.0
            return n

        def _calculate_rewards(self) -> None:
            clock[0] += 3.0

    trainer = Trainer()
    timer = timing.PhaseTimer(trainer)
    assert trainer._generate(7) == 7
    trainer._calculate_rewards()
    trainer._calculate_rewards()
    assert timer.split(20.0) == {"seconds_generation": 2.0, "seconds_reward": 6.0, "seconds_update": 12.0}
    assert timer.split(5.0)["seconds_update"] == 0.0  # never negative
    for generation, update in ((10.0, 4.0), (3.0, 1.0), (2.0, 0.5)):
        timer.step_began()
        clock[0] += generation
        trainer._generate(1)  # moves the clock by 2 s more
        trainer._calculate_rewards()  # and 3 s
        clock[0] += update
        timer.step_ended()
    split = timer.split(100.0)
    assert split["first_step"] == {"seconds": 19.0, "seconds_generation": 2.0, "seconds_reward": 3.0,
                                   "seconds_update": 14.0}
    assert split["last_step"] == {"seconds": 7.5, "seconds_generation": 2.0, "seconds_reward": 3.0,
                                  "seconds_update": 2.5}


def test_grpo_settings_are_typed_and_owned() -> None:
    cfg = TrainingConfig()
    settings = cfg.grpo_settings()
    assert settings["loss_type"] == "grpo" and settings["lr_scheduler_type"] == "cosine"
    assert settings["warmup_steps"] == 0.05 and "epsilon_high" not in settings
    assert TrainingConfig(epsilon_high=0.28).grpo_settings()["epsilon_high"] == 0.28
    for name in ("loss_type", "weight_decay", "top_k", "vllm_importance_sampling_correction"):
        with pytest.raises(ValueError, match="typed training fields"):
            TrainingConfig(grpo_args={name: 1})
    with pytest.raises(ValueError):
        TrainingConfig(loss_type="ppo")
    with pytest.raises(ValueError, match="max_model_length"):
        TrainingConfig(use_cpu=False, vllm=VLLMRollouts(max_model_length=6144))
    assert TrainingConfig(max_prompt_length=None, vllm=VLLMRollouts(max_model_length=6144)).vllm is not None


def test_long_prompts_lose_their_beginning(tiny_lm_path: Path) -> None:
    """ms-swift's prompt limit, which TRL lacks: a prompt over max_prompt_length keeps its
    last tokens (the question), and then every prompt is passed as chat-templated text."""
    from embodied_r.backends.truncation import limit_prompts, load_processing_class, templated

    conversations = [[{"role": "system", "content": "SYSTEM"}, {"role": "user", "content": "x " * n + "QUESTION?"}]
                     for n in (5, 400)]
    short = [{"prompt": conversations[0]}]
    assert limit_prompts(short, str(tiny_lm_path), 64).cut == 0 and short[0]["prompt"] is conversations[0]
    rows = [{"prompt": c, "question": "QUESTION?"} for c in conversations]
    cut = limit_prompts(rows, str(tiny_lm_path), 64, parts={"question": lambda r: [r["question"]]})
    assert (cut.cut, cut.prompts, cut.past_system, cut.lost) == (1, 2, 1, {"question": 0})
    assert cut.removed == cut.tokens - 64 > 0
    assert cut.describe().startswith("prompts read from their end, max_prompt_length=64 tokens: 1 of 2 are cut")
    assert "every prompt keeps its question whole" in cut.describe()
    processing = load_processing_class(str(tiny_lm_path))
    tokenizer = getattr(processing, "tokenizer", processing)
    assert rows[0]["prompt"] == templated(processing, conversations[0])  # short: whole, as text
    long_ids = tokenizer(rows[1]["prompt"], add_special_tokens=False)["input_ids"]
    assert len(long_ids) <= 64 and "QUESTION?" in rows[1]["prompt"] and "SYSTEM" not in rows[1]["prompt"]


def test_a_prompt_cut_says_what_it_removes(tiny_lm_path: Path) -> None:
    """The line a cut prints counts the prompts that lost the start of a part that should reach
    the model whole, and names a part no prompt lost as kept."""
    from embodied_r.backends.truncation import limit_prompts

    def row(question: str) -> dict:
        return {"prompt": [{"role": "system", "content": "SYSTEM"},
                           {"role": "user", "content": "x " * 200 + question + " A. yes B. no"}],
                "question": question, "options": ["A. yes", "B. no"]}

    rows = [row("Which way?"), row("Which " + "very " * 100 + "long way?")]
    cut = limit_prompts(rows, str(tiny_lm_path), 64, parts={"question": lambda r: [r["question"]],
                                                            "options": lambda r: r["options"]})
    assert (cut.cut, cut.lost) == (2, {"question": 1, "options": 0})
    line = cut.describe()
    assert "1 of them also lose the start of their question" in line
    assert "every prompt keeps its options whole" in line and "the video text" in line
