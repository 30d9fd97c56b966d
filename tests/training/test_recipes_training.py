"""The training recipes shipped with the package: they load, say what the issue asks, and
every accelerate / DeepSpeed file they name exists and parses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from embodied_r.config import load_recipe
from embodied_r.training.config import TrainingConfig
from embodied_r.training.environment import PROJECT_ROOT, deepspeed_file, num_processes, resolve_config_file

GPU_RECIPES = ("paper-8gpu", "paper-5gpu", "single-gpu")
PAPER_WEIGHTS = [(2, {"format": 0.7, "accuracy": 0.3, "consistency": 0.0}),
                 (2, {"format": 0.3, "accuracy": 0.7, "consistency": 0.0}),
                 (8, {"format": 0.1, "accuracy": 0.7, "consistency": 0.2})]


def _schedule(cfg: TrainingConfig) -> list[tuple[float, dict[str, float]]]:
    return [(s.epochs, s.rewards) for s in cfg.stages]


def _completions_per_step(cfg: TrainingConfig) -> int:
    processes = num_processes(resolve_config_file(cfg.accelerate_config)) if cfg.accelerate_config else 1
    return processes * cfg.per_device_train_batch_size * cfg.accumulation_steps(processes)


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_gpu_recipes_keep_the_papers_method(name: str) -> None:
    cfg = load_recipe(name).training
    assert _schedule(cfg) == PAPER_WEIGHTS
    assert (cfg.beta, cfg.num_generations, cfg.max_completion_length) == (0.001, 8, 2048)
    assert not cfg.use_cpu and cfg.bf16 and cfg.gradient_checkpointing
    # 4 prompts x 8 generations per optimizer step, as the original.
    assert _completions_per_step(cfg) == 32
    assert cfg.reference.max_new_tokens == 10 and cfg.reference.temperature == 0.1
    assert cfg.consistency_requires_correct


def test_paper_8gpu() -> None:
    cfg = load_recipe("paper-8gpu").training
    assert cfg.learning_rate == 5e-7 and cfg.launcher == "accelerate"
    config = resolve_config_file(cfg.accelerate_config)
    assert config == PROJECT_ROOT / "infra" / "training" / "accelerate-zero3-8gpu.yaml"
    assert num_processes(config) == 8
    assert cfg.vllm is not None and cfg.vllm.mode == "colocate" and cfg.vllm.max_model_length == 8192
    # The reference over an API (the original called a hosted Qwen2.5-VL-3B), key from the environment.
    assert cfg.reference.kind == "openai" and cfg.reference.base_url.startswith("https://")
    assert cfg.reference.api_key_env == "DASHSCOPE_API_KEY" and cfg.lora is None


def test_paper_5gpu_leaves_one_gpu_to_the_served_reference() -> None:
    import yaml

    cfg = load_recipe("paper-5gpu").training
    assert cfg.learning_rate == 5e-7 and cfg.vllm is not None and cfg.vllm.mode == "colocate"
    config = resolve_config_file(cfg.accelerate_config)
    assert num_processes(config) == 4
    assert str(yaml.safe_load(config.read_text())["gpu_ids"]) == "0,1,2,3"
    assert cfg.reference.kind == "openai" and cfg.reference.base_url == "http://127.0.0.1:8001/v1"
    # The start script serves that model on GPU 4 at that address by default.
    script = (PROJECT_ROOT / "infra" / "training" / "serve-reference.sh").read_text()
    for default in ('REFERENCE_GPU:-4', 'REFERENCE_PORT:-8001', 'REFERENCE_HOST:-127.0.0.1',
                    f'REFERENCE_MODEL:-{cfg.reference.model}', "vllm serve"):
        assert default in script, default


def test_single_gpu_uses_lora_without_deepspeed() -> None:
    cfg = load_recipe("single-gpu").training
    assert cfg.launcher == "python" and cfg.accelerate_config is None
    assert cfg.lora is not None and cfg.lora.r == 64
    assert cfg.vllm is None  # fits 24 GB; the recipe says how to add vLLM on larger cards
    assert cfg.reference.kind == "transformers" and cfg.reference.device == "cuda"
    vllm_on = load_recipe("single-gpu", {"training": {"vllm": {"gpu_memory_utilization": 0.3}}}).training
    assert vllm_on.vllm is not None and vllm_on.vllm.mode == "colocate"


def test_cpu_demo_runs_the_whole_schedule() -> None:
    demo, cpu = load_recipe("smoke"), load_recipe("cpu-demo")
    assert cpu.training.use_cpu and cpu.training.max_steps_per_stage is None
    assert demo.training.max_steps_per_stage is not None
    assert _schedule(cpu.training) == PAPER_WEIGHTS
    assert cpu.training.policy == "tiny:lm" and cpu.download.source == "synthetic"
    assert cpu.training.completion_table_steps < 50


@pytest.mark.parametrize("config", ["accelerate-zero3-8gpu.yaml", "accelerate-zero3-4gpu.yaml"])
def test_accelerate_configs_parse_and_launch(config: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate reads each file as it would at launch, with the arguments embodied-r adds."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    path = PROJECT_ROOT / "infra" / "training" / config
    cluster = load_config_from_file(str(path))
    assert cluster.distributed_type.value == "DEEPSPEED"
    ds = deepspeed_file(path)
    assert ds == PROJECT_ROOT / "infra" / "training" / "deepspeed-zero3.json"

    monkeypatch.chdir(tmp_path)  # a launch from anywhere finds the DeepSpeed file
    cfg = TrainingConfig(launcher="accelerate", accelerate_config=str(path), per_device_train_batch_size=1,
                         gradient_accumulation_steps=8)
    cmd = cfg.command("embodied_r.training.grpo", tmp_path / "spec.json")
    args = launch_command_parser().parse_args(cmd[cmd.index("accelerate.commands.launch") + 1:])
    args, _, _ = _validate_launch_command(args)
    assert args.use_deepspeed and args.num_processes == cluster.num_processes
    assert args.deepspeed_config_file == str(ds) and args.zero3_init_flag
    assert args.module and args.training_script == "embodied_r.training.grpo"


def test_deepspeed_config_is_zero3_with_trainer_filled_values() -> None:
    ds = json.loads((PROJECT_ROOT / "infra" / "training" / "deepspeed-zero3.json").read_text())
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["stage3_gather_16bit_weights_on_model_save"] is True
    # Batch sizes and precision come from the trainer's arguments, so they cannot disagree.
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        assert ds[key] == "auto"
    assert ds["bf16"]["enabled"] == "auto"


def _trl_args(name: str, stage: int = 2) -> Any:
    """TRL's GRPOConfig built from a recipe as the trainer process builds it. This machine
    has one process and no GPU: bf16 is off and the per-process batch is the global one."""
    from embodied_r.training.grpo import grpo_args, reward_setup

    cfg = load_recipe(name).training
    per_step = _completions_per_step(cfg)
    accumulation = cfg.accumulation_steps(cfg.world() or 1)
    local = cfg.model_copy(update={"bf16": False, "per_device_train_batch_size": per_step // accumulation})
    funcs, weights = reward_setup(local.stages[stage], local)
    return grpo_args(local.stages[stage], local, Path("/tmp/unused"), weights, []), funcs


@pytest.mark.parametrize("name", ["paper-8gpu", "paper-5gpu"])
def test_trl_receives_the_vllm_options(name: str) -> None:
    args, funcs = _trl_args(name)
    cfg = load_recipe(name).training
    assert args.use_vllm is True and args.vllm_mode == "colocate"
    assert args.vllm_gpu_memory_utilization == cfg.vllm.gpu_memory_utilization
    assert args.vllm_tensor_parallel_size == 1 and args.vllm_max_model_length == 8192
    assert (args.learning_rate, args.beta, args.num_generations, args.max_completion_length) == (5e-7, 0.001, 8, 2048)
    assert args.reward_weights == [0.1, 0.7, 0.2] and args.activation_checkpointing
    assert [getattr(f, "__name__", "") for f in funcs] == ["format_reward", "accuracy_reward", "consistency_reward"]
    assert funcs[2]._backend is None  # the reference is reached only when first needed


def test_trl_receives_the_single_gpu_options() -> None:
    pytest.importorskip("peft")
    from embodied_r.training.grpo import peft_config

    args, _ = _trl_args("single-gpu")
    assert args.use_vllm is False and args.learning_rate == 1e-5
    lora = peft_config(load_recipe("single-gpu").training.lora)
    assert lora.r == 64 and lora.lora_alpha == 128 and lora.task_type == "CAUSAL_LM"


def test_trl_receives_the_official_loss_optimizer_and_sampling() -> None:
    """The settings TRL would otherwise default differently reach GRPOConfig as ms-swift 3.3
    ran them (docs/fidelity.md has every value; tests/test_fidelity.py checks it)."""
    args, _ = _trl_args("paper-8gpu")
    assert (args.loss_type, args.scale_rewards, args.epsilon) == ("grpo", "group", 0.2)
    assert str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)) == "cosine"
    assert (args.weight_decay, args.adam_beta1, args.adam_beta2, args.max_grad_norm) == (0.1, 0.9, 0.95, 1.0)
    assert (args.temperature, args.top_p, args.top_k, args.repetition_penalty) == (1.0, 0.9, 50, 1.0)
    assert args.vllm_importance_sampling_correction is False
    assert args.warmup_steps == 0.05 and args.seed == 42


@pytest.mark.parametrize(("name", "generations"), [("official-script", 8), ("official-script-5gpu", 4)])
def test_the_released_scripts(name: str, generations: int) -> None:
    cfg = load_recipe(name).training
    assert _schedule(cfg) == [(2, {"format": 0.1, "accuracy": 0.7, "consistency": 0.2})] and cfg.num_generations == generations
    # 4 prompts per optimizer step, as both scripts: 8 x 1 x 4 / 8, and 4 x 1 x 4 / 4.
    assert _completions_per_step(cfg) == 4 * generations
    assert cfg.scoring.answer_parser == "official" and cfg.vllm is not None
    args, funcs = _trl_args(name, stage=0)
    assert args.reward_weights == [0.1, 0.7, 0.2] and args.num_generations == generations
    assert [getattr(f, "__name__", "") for f in funcs] == ["format_reward", "accuracy_reward", "consistency_reward"]


def test_improved_turns_on_the_named_improvements() -> None:
    paper, improved = load_recipe("paper"), load_recipe("improved")
    assert (improved.perception.mode, improved.perception.reply_format) == ("per_video", "json")
    assert improved.training.scoring.answer_parser == "strict"
    assert improved.training.scoring.consistency_when_reference_down == "unscored"
    assert improved.evaluation.answer_parser == "strict"
    # The method itself is the paper's, but for the named training improvements.
    named = {"scoring", "prompt_cut", "stage_chain", "keep_best"}
    assert (improved.training.prompt_cut, improved.training.stage_chain, improved.training.keep_best) == (
        "both", "fresh", True)
    assert improved.training.model_dump(exclude=named) == paper.training.model_dump(exclude=named)
