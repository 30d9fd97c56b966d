"""The trainer against the GPU training environment: keyword names read from the installed
library, bf16 master weights, the checkpoint disk estimate, prompt lengths at convert time,
the vLLM 0.31 engine shutdown, the reference's concurrency across ranks, the VL policy's
language model, and the checker that ``.ci/run`` runs in the pinned environment
(``infra/training/check-env.sh``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from embodied_r.backends.base import BackendConfig, Generation
from embodied_r.config import load_recipe
from embodied_r.errors import DiskSpaceError
from embodied_r.training import disk
from embodied_r.training.config import GRPOStageConfig
from embodied_r.training.environment import PROJECT_ROOT, LoraSettings
from embodied_r.training.records import run_records
from embodied_r.training.records_config import RecordsConfig
from embodied_r.training.trl_args import build_config, field_name
from tests.stage_inputs import VIDEO, catalog_row, write_inputs
from tests.training.test_training import records, tiny_cfg  # noqa: F401 - the records fixture is shared


# --- 2. keyword names from the installed library -----------------------------------------

@dataclasses.dataclass
class Old:  # transformers 5.17's shape
    output_dir: str = ""
    gradient_checkpointing: bool = False


@dataclasses.dataclass
class New(Old):  # transformers 5.23's shape
    activation_checkpointing: bool | None = None


def test_checkpointing_is_named_as_the_installed_library_names_it() -> None:
    assert field_name(Old, "gradient_checkpointing") == "gradient_checkpointing"
    assert field_name(New, "gradient_checkpointing") == "activation_checkpointing"
    with pytest.raises(TypeError) as err:
        build_config(Old, {"output_dir": "x", "activation_checkpointing": True})
    message = str(err.value)
    assert "Old" in message and "activation_checkpointing" in message and "gradient_checkpointing" in message
    assert build_config(Old, {"gradient_checkpointing": True}).gradient_checkpointing is True


def test_grpo_and_sft_args_use_only_installed_names(tmp_path: Path) -> None:
    from transformers import TrainingArguments

    from embodied_r.training.config import SFTConfig
    from embodied_r.training.grpo import grpo_args
    from embodied_r.training.sft_child import sft_args

    stage = GRPOStageConfig(name="s", rewards={"format": 1.0})
    args = grpo_args(stage, tiny_cfg([stage], gradient_checkpointing=True), tmp_path, [1.0], [])
    assert args.gradient_checkpointing is True
    assert sft_args(SFTConfig(use_cpu=True, gradient_checkpointing=False), tmp_path, []).gradient_checkpointing is False
    with pytest.raises(TypeError, match="no_such_argument"):
        grpo_args(stage, tiny_cfg([stage], grpo_args={"no_such_argument": 1}), tmp_path, [1.0], [])
    assert field_name(TrainingArguments, "gradient_checkpointing") in {f.name for f in
                                                                       dataclasses.fields(TrainingArguments)}


# Every SFT setting away from its default, so that a setting the trainer does not receive reads
# back as TRL's default and fails.
CHANGED_SFT = {"learning_rate": 3e-4, "epochs": 2.0, "max_steps": 7, "per_device_train_batch_size": 2,
               "gradient_accumulation_steps": 3, "lr_scheduler_type": "constant_with_warmup", "warmup_ratio": 0.2,
               "weight_decay": 0.05, "adam_beta1": 0.8, "adam_beta2": 0.95, "adam_epsilon": 1e-6,
               "max_grad_norm": 0.5, "max_length": 123}


@pytest.mark.parametrize("pipeline", ["embodied-r", "embodied-reasoner"])
def test_every_sft_setting_reaches_the_trainer_in_both_pipelines(tmp_path: Path, pipeline: str) -> None:
    from embodied_r.interactive.sft_config import ReasonerSFTConfig
    from embodied_r.training.config import SFTConfig
    from embodied_r.training.sft_settings import TRL_SFT_NAMES, SFTSettings
    from embodied_r.training.environment import TrainerEnvironment
    from embodied_r.training.sft_child import sft_args

    assert set(CHANGED_SFT) == set(SFTSettings.model_fields) - set(TrainerEnvironment.model_fields) - {"sft_args"}
    cls = SFTConfig if pipeline == "embodied-r" else ReasonerSFTConfig
    assert all(cls.model_fields[name].default != value for name, value in CHANGED_SFT.items())
    args = sft_args(cls(use_cpu=True, gradient_checkpointing=False, **CHANGED_SFT), tmp_path, [])
    for name, value in CHANGED_SFT.items():
        read = getattr(args, TRL_SFT_NAMES.get(name, name))
        assert getattr(read, "value", read) == value, name
    assert args.loss_type == "nll"


# --- 4. bf16: fp32 master weights ----------------------------------------------------------

@pytest.mark.parametrize("recipe, bf16_weights", [
    ("paper", False),  # accelerate without DeepSpeed: DDP with a plain AdamW
    ("paper-5gpu", True), ("paper-8gpu", True),  # DeepSpeed keeps fp32 master weights
    ("single-gpu", True),  # LoRA: frozen base, fp32 adapters
])
def test_bf16_weights_only_beside_an_fp32_master_copy(recipe: str, bf16_weights: bool, tmp_path: Path) -> None:
    from embodied_r.training.grpo import common_args

    training = load_recipe(recipe).training.model_copy(update={"bf16": True})
    assert training.bf16_weights(True) is bf16_weights
    kwargs = common_args(training, tmp_path, "s", [])
    assert kwargs["bf16"] is True  # bf16 compute either way
    assert (kwargs.get("model_init_kwargs") == {"dtype": "bfloat16"}) is bf16_weights


# --- 5. checkpoint disk ----------------------------------------------------------------------

SHAPES = {"model.embed_tokens.weight": [1000, 500], "model.layers.0.self_attn.q_proj.weight": [500, 500],
          "model.layers.0.mlp.up_proj.weight": [1000, 500], "model.norm.weight": [500]}
PARAMS = 500_000 + 250_000 + 500_000 + 500


def test_checkpoint_estimate_per_setup() -> None:
    paper = load_recipe("paper-8gpu").training
    # The official 200 checkpoints kept: every one of 1000 steps / 100 (and the last).
    assert disk.estimate(paper, SHAPES, steps=1000).kept == 11
    deepspeed = paper.model_copy(update={"save_total_limit": 2})
    est = disk.estimate(deepspeed, SHAPES, steps=1000)
    assert est.parameters == PARAMS
    assert est.per_checkpoint == PARAMS * 14  # 16-bit weights + fp32 master + two Adam moments
    assert est.kept == 3  # save_total_limit 2, plus the new one before the oldest goes
    assert est.final_model == PARAMS * 2
    ddp = load_recipe("paper").training.model_copy(update={"bf16": True})
    assert disk.estimate(ddp, SHAPES, steps=1000).per_checkpoint == PARAMS * 12  # fp32 weights + Adam
    weights_only = ddp.model_copy(update={"save_only_model": True})
    assert disk.estimate(weights_only, SHAPES, steps=1000).per_checkpoint == PARAMS * 4
    few = ddp.model_copy(update={"save_steps": 400, "save_total_limit": None})
    assert disk.estimate(few, SHAPES, steps=1000).kept == 3  # steps 400, 800 and the last
    lora = load_recipe("single-gpu").training
    # Only q_proj and up_proj match the recipe's pattern; r 64 x (in + out) each.
    assert disk.lora_parameters(SHAPES, 64, lora.lora.target_modules) == 64 * (1000 + 1500)
    assert disk.lora_parameters(SHAPES, 8, "all-linear") == 8 * (1000 + 1500)
    assert disk.lora_parameters(SHAPES, 8, ["q_proj"]) == 8 * 1000
    assert disk.estimate(lora, SHAPES, steps=1000).per_checkpoint == 64 * 2500 * 12


def test_a_stage_without_room_for_its_checkpoints_fails_before_training(
        records: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from embodied_r.training.stage import run_training_stage

    stage = GRPOStageConfig(name="s", rewards={"format": 1.0})
    monkeypatch.setattr(disk, "free_bytes", lambda path: 1000)
    with pytest.raises(DiskSpaceError) as err:
        run_training_stage(records, "tiny:lm", tmp_path / "out", stage, tiny_cfg([stage]))
    message = str(err.value)
    for knob in ("save_total_limit", "save_steps", "save_only_model"):
        assert knob in message
    # A tiny model's need in a unit that shows it, not "0.0 GB".
    assert "needs about 2.0 MB" in message and "0.0 GB" not in message
    assert not (tmp_path / "out.partial" / "train.log").exists()  # no trainer was started
    # A resume chain also keeps the stage's last checkpoint for the next stage: one more.
    with pytest.raises(DiskSpaceError) as chained:
        run_training_stage(records, "tiny:lm", tmp_path / "out", stage, tiny_cfg([stage], stage_chain="resume"))
    fresh_kept, chain_kept = (int(str(e.value).split(" checkpoint(s)")[0].rsplit(" ", 1)[1]) for e in (err, chained))
    assert chain_kept == fresh_kept + 1


def test_weight_shapes_are_read_from_the_safetensors_headers(tiny_lm_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    shapes = disk.tensor_shapes(str(tiny_lm_path))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm_path), dtype=torch.float32)
    assert sum(int(torch.tensor(s).prod()) for s in shapes.values()) == sum(
        p.numel() for p in model.parameters())
    assert disk.tensor_shapes("/no/such/folder") is None


# --- 3. prompt lengths at convert time -------------------------------------------------------

def test_prompts_too_long_for_the_rollouts_are_left_out_with_their_length(tmp_path: Path, tiny_lm_path: Path) -> None:
    rows = [catalog_row("urbanvideo:1", "train"), catalog_row("urbanvideo:2", "train"),
            catalog_row("urbanvideo:3", "test")]
    long_video = VIDEO + "\n" + "\n".join(f"Frame {i}: After move forward, Observe: a red building." for i in range(2, 60))
    texts = {"urbanvideo:1": VIDEO, "urbanvideo:2": long_video, "urbanvideo:3": long_video}
    catalog, perception = write_inputs(tmp_path, rows, texts)
    measured = run_records(catalog, perception, tmp_path / "m", RecordsConfig(tokenizer=str(tiny_lm_path)))
    assert measured["done"] == 3 and measured["max_prompt_tokens"] is None and "prompts_too_long" not in measured
    longest = measured["prompt_tokens_max"]
    assert longest > measured["prompt_tokens_mean"] > 0

    limit = longest - 1
    summary = run_records(catalog, perception, tmp_path / "r", RecordsConfig(tokenizer=str(tiny_lm_path),
                                                                              max_prompt_tokens=limit))
    assert summary["prompts_too_long"] == 1 and summary["prompts_over_limit_test"] == 1
    assert summary["failure_reasons"] == {"prompt_too_long": 1}
    assert summary["records_train"] == 1 and summary["records_test"] == 1  # test keeps its long question
    failures = pq.read_table(tmp_path / "r" / "failures.parquet").to_pylist()
    assert failures == [{"stage": "records", "item": "urbanvideo:2", "reason": "prompt_too_long",
                         "prompt_tokens": longest}]


def test_recipes_measure_prompts_with_the_policy_against_the_rollouts_limit() -> None:
    eight = load_recipe("paper-8gpu")
    assert eight.records.tokenizer == eight.training.policy
    # The trainer cuts prompts to 6144 tokens, which 8192 - 2048 holds: none is dropped.
    assert eight.training.max_prompt_length == 6144 and eight.records.max_prompt_tokens is None
    uncut = load_recipe("paper-8gpu", {"training": {"max_prompt_length": None}})
    assert uncut.records.max_prompt_tokens == 8192 - 2048
    assert load_recipe("smoke").records.tokenizer == "tiny:lm"
    assert load_recipe("smoke").records.max_prompt_tokens is None  # no vLLM rollouts
    own = load_recipe("paper-8gpu", {"records": {"max_prompt_tokens": 3000}})
    assert own.records.max_prompt_tokens == 3000
    with pytest.raises(ValueError, match="no room for a prompt"):
        load_recipe("paper-8gpu", {"training": {"max_prompt_length": None, "vllm": {"max_model_length": 2048}}})
    with pytest.raises(ValueError, match="must hold a prompt and a completion"):
        load_recipe("paper-8gpu", {"training": {"vllm": {"max_model_length": 2048}}})


# --- 6. vLLM 0.31 engine shutdown ------------------------------------------------------------

class EngineCoreClient:  # vllm.v1.engine.core_client's shape: shutdown(timeout=None)
    def __init__(self) -> None:
        self.shutdowns = 0

    def shutdown(self, timeout: float | None = None) -> None:
        self.shutdowns += 1


class LLMEngine:  # 0.31: no shutdown of its own, the client in engine_core
    def __init__(self) -> None:
        self.engine_core = EngineCoreClient()


class LLM:  # 0.31: no shutdown either
    def __init__(self) -> None:
        self.llm_engine = LLMEngine()


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    cleaned: list[str] = []
    parallel_state = types.ModuleType("vllm.distributed.parallel_state")
    parallel_state.cleanup_dist_env_and_memory = lambda shutdown_ray=False: cleaned.append("cleanup")
    for name, module in {"vllm": types.ModuleType("vllm"), "vllm.distributed": types.ModuleType("vllm.distributed"),
                         "vllm.distributed.parallel_state": parallel_state}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return cleaned


def test_vllm_031_engine_is_shut_down_through_its_core_client(fake_vllm: list[str]) -> None:
    from embodied_r.backends.vllm_engine import VLLMBackend, shutdown_engine

    backend = VLLMBackend.__new__(VLLMBackend)
    llm = backend.llm = LLM()
    core = llm.llm_engine.engine_core
    backend.close()
    assert core.shutdowns == 1 and fake_vllm == ["cleanup"] and backend.llm is None
    backend.close()  # closing twice is harmless
    assert core.shutdowns == 1 and fake_vllm == ["cleanup"]

    class Newer(LLM):  # a release with LLM.shutdown uses it
        def shutdown(self) -> None:
            self.closed = True

    newer = Newer()
    assert shutdown_engine(newer) == "LLM.shutdown" and newer.closed
    assert newer.llm_engine.engine_core.shutdowns == 0
    assert shutdown_engine(types.SimpleNamespace(llm_engine=object())) == "none"


# --- 7. the reference over a hosted API --------------------------------------------------

def test_http_reference_concurrency_is_shared_by_the_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    from embodied_r.scoring.rewards import reference_for_rank
    from embodied_r.training.grpo import reward_setup

    hosted = load_recipe("paper-8gpu").training.reference
    assert reference_for_rank(hosted, 8).concurrency == hosted.concurrency // 8 == 2
    assert reference_for_rank(hosted, 1) is hosted
    assert reference_for_rank(hosted.model_copy(update={"concurrency": 4}), 8).concurrency == 1
    local = BackendConfig(kind="transformers", model="tiny:lm")
    assert reference_for_rank(local, 8) is local
    monkeypatch.setenv("WORLD_SIZE", "8")
    stage = GRPOStageConfig(name="s3", rewards={"format": 0.1, "accuracy": 0.7, "consistency": 0.2})
    funcs, _ = reward_setup(stage, load_recipe("paper-8gpu").training)
    assert funcs[2]._cfg.concurrency == 2


class HalfFailing:
    def __init__(self) -> None:
        self.calls = 0

    def generate(self, conversations: list[Any], **kwargs: Any) -> list[Generation]:
        return [Generation(text="C") if i % 2 == 0 else Generation(text="", error="HTTP 429: slow down")
                for i in range(len(conversations))]

    def close(self) -> None:
        pass


def test_skipped_consistency_scores_are_counted_every_call() -> None:
    from embodied_r.scoring.rewards import make_consistency_reward

    reward = make_consistency_reward(HalfFailing())
    good = "<think>It is ahead.</think><answer>C</answer>"
    metrics: dict[str, list[float]] = {}
    log = lambda name, value: metrics.setdefault(name, []).append(value)  # noqa: E731
    kwargs = dict(solution=["C"] * 4, question=["q"] * 4, answer_type=["choice"] * 4, options=[["A", "B", "C"]] * 4)
    assert reward([good, good, good, "nothing"], log_metric=log, **kwargs) == [1.0, None, 1.0, 0.0]
    reward(["nothing"] * 4, log_metric=log, **kwargs)  # nothing to ask
    assert metrics["consistency/skipped"] == [1.0, 0.0]
    assert metrics["consistency/skipped_ratio"] == [0.25, 0.0]


# --- 9. the VL policy trains as its language model --------------------------------------------

def test_vl_policy_is_reduced_to_its_language_model(tiny_vlm_path: Path, tiny_lm_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2_5_VLForConditionalGeneration

    from embodied_r.training.policy import load_tokenizer, training_model
    from embodied_r.training.stage import local_model

    lm = Path(training_model("tiny:vlm"))
    assert lm.name.startswith("lm-of-tiny-vlm-") and local_model("tiny:vlm") == str(lm.resolve())
    assert training_model(str(tiny_lm_path)) == str(tiny_lm_path)  # a causal LM stays as it is
    assert training_model("tiny:vlm") == str(lm)  # extracted once
    tok = load_tokenizer(str(lm))
    ids = tok.apply_chat_template([{"role": "user", "content": "Which way is the tower? A. left B. right"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    vl = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tiny_vlm_path)).eval()
    text = AutoModelForCausalLM.from_pretrained(str(lm)).eval()
    assert type(text).__name__ == "Qwen2ForCausalLM"
    with torch.no_grad():
        assert torch.allclose(vl(**ids).logits, text(**ids).logits, atol=1e-5)
    assert sum(p.numel() for p in text.parameters()) < sum(p.numel() for p in vl.parameters())


# --- 1. the checker itself, here in the base environment ---------------------------------------

def _child() -> Any:
    from embodied_r.checks import env_configs

    return env_configs


def _case(name: str, **overrides: Any) -> dict[str, Any]:
    from embodied_r.checks.env import world_of

    recipe = load_recipe(name, overrides or None)
    world, gpus = world_of(recipe.training)
    if gpus:  # accelerate picks the count: 4 processes, where 32 completions divide
        world = gpus = 4
    from embodied_r.lifecycle.sft_baseline import sft_config_for

    return {"recipe": name, "world": world, "gpus": gpus, "training": recipe.training.model_dump(mode="json"),
            "sft": sft_config_for(recipe).model_dump(mode="json")}


@pytest.mark.parametrize("recipe", ["smoke", "demo", "paper", "single-gpu"])
def test_checker_builds_the_recipes_configs(recipe: str, tmp_path: Path) -> None:
    result = _child().run_case(_case(recipe), tmp_path)
    assert result["problems"] == [] and result["built"] == result["expected"]
    assert result["launch"]["processes"] == result["world"]


def test_checker_sees_a_wrong_keyword_and_bf16_weights_under_adamw(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    child = _child()
    planted = child.run_case(_case("smoke", training={"grpo_args": {"no_such_argument": 1}}), tmp_path)
    assert planted["built"] == ["sft"] and all("no_such_argument" in p for p in planted["problems"])
    from embodied_r.training.environment import TrainerEnvironment

    monkeypatch.setattr(TrainerEnvironment, "bf16_weights", lambda self, bf16: bf16)  # the old behaviour
    paper = child.run_case(_case("paper"), tmp_path)
    assert paper["built"] == [] and all("bf16 weights under a plain AdamW" in p for p in paper["problems"])


def test_checker_sees_a_name_the_library_deprecated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradient checkpointing passed under its name before transformers 5.23: the configs
    still build, with a FutureWarning each (TRL's default for the old name warns unless the
    new one is passed, so it must be passed by the new name), and the checker refuses them."""
    from transformers import TrainingArguments

    from embodied_r.training import trl_args

    if field_name(TrainingArguments, "gradient_checkpointing") == "gradient_checkpointing":
        pytest.skip("the installed transformers knows only the old name")
    monkeypatch.setitem(trl_args.RENAMED, "gradient_checkpointing", ("gradient_checkpointing",))
    planted = _child().run_case(_case("smoke"), tmp_path)
    assert planted["built"] == [] and planted["problems"], planted
    assert all("FutureWarning: `gradient_checkpointing` is deprecated" in p for p in planted["problems"]), planted


def test_checker_sees_a_pad_guard_that_lets_a_chat_token_through(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    child = _child()
    assert child.check_pad_guard(tmp_path) == []
    from embodied_r.backends import tokens

    monkeypatch.setattr(tokens, "check_folder_pad", lambda folder: None)
    assert child.check_pad_guard(tmp_path) == ["a folder whose eos (and so its padding) is <|im_start|> was not refused"]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_checker_resolves_the_deepspeed_launch(tmp_path: Path) -> None:
    result = _child().run_case(_case("paper-8gpu"), tmp_path)
    assert result["problems"] == [] and result["launch"] == {"launcher": "deepspeed", "processes": 8}


def test_ci_runs_the_training_environment_check() -> None:
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    assert "make test" in ci and "infra/training/check-env.sh" in ci
    assert LoraSettings  # the LoRA recipe is among those checked
