"""What a first run on a GPU found: the precision a GPU without bf16 falls back to, the GPU a
reference goes to under a multi-process launch, a pad token the chat template writes (the
NaN at GRPO's first step), fp32 weights under a plain AdamW in the Embodied-Reasoner SFT,
and the memory a recipe needs per GPU."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from embodied_r.backends import devices
from embodied_r.backends.base import BackendConfig
from embodied_r.backends.tokens import check_folder_pad, pad_problem
from embodied_r.config import load_recipe
from embodied_r.errors import PadTokenError
from embodied_r.training import memory, shapes
from embodied_r.training.environment import TrainerEnvironment

# --- precision on a GPU without native bf16 --------------------------------------------------


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch):
    """A CUDA GPU as torch would report it, bf16 native or not: no such card can be put in
    this machine, so torch's own queries answer for it."""
    import torch

    def fake(bf16: bool, name: str = "Tesla T4") -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16 or including_emulation)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)

    return fake


def test_a_gpu_without_bf16_trains_in_fp16_mixed_precision_and_says_so(gpu, tmp_path, caplog) -> None:
    from embodied_r.training.grpo import common_args

    gpu(bf16=False)  # a T4: bf16 only emulated, which torch's default query counts as support
    for asked in (None, True):
        env = TrainerEnvironment(bf16=asked)
        with caplog.at_level(logging.WARNING):
            kwargs = common_args(env, tmp_path, "s", [])
        assert (kwargs["bf16"], kwargs["fp16"]) == (False, True)
        assert "model_init_kwargs" not in kwargs  # fp32 weights under fp16 loss scaling
    notes = [r.getMessage() for r in caplog.records if "no native bf16" in r.getMessage()]
    assert notes and "Tesla T4" in notes[0] and "fp16 mixed precision" in notes[0] and "training.bf16: false" in notes[0]
    assert common_args(TrainerEnvironment(bf16=False), tmp_path, "s", [])["fp16"] is False  # fp32, as asked
    assert devices.inference_dtype(True) == "float16"


def test_a_gpu_with_bf16_and_the_cpu_keep_their_precision(gpu, tmp_path) -> None:
    from embodied_r.training.grpo import common_args

    assert devices.training_precision(None, use_cpu=False).name == "fp32"  # this machine: no GPU
    assert devices.training_precision(True, use_cpu=True).name == "bf16"  # CPU autocast, as asked
    gpu(bf16=True, name="NVIDIA H100")
    kwargs = common_args(TrainerEnvironment(), tmp_path, "s", [])
    assert (kwargs["bf16"], kwargs["fp16"]) == (True, False)
    assert devices.training_precision(None, use_cpu=True).name == "fp32"
    assert devices.inference_dtype(True) == "bfloat16" and devices.inference_dtype(False) == "float32"


# --- where a transformers model goes -------------------------------------------------------


def test_auto_in_a_multi_process_launch_is_the_ranks_own_gpu() -> None:
    place = devices.placement
    assert place("auto", True, None) == ("cuda", "auto")  # alone: spread over every GPU
    assert [place("auto", True, rank) for rank in range(3)] == [("cuda:0", None), ("cuda:1", None), ("cuda:2", None)]
    assert place("cuda", True, 5) == ("cuda:5", None) and place("cuda", True, None) == ("cuda", None)
    assert place("cuda:1", True, 3) == ("cuda:1", None)  # a numbered GPU is taken as given
    assert place("auto", False, 2) == ("cpu", None) and place("cpu", True, 1) == ("cpu", None)
    assert devices.launch_rank({"WORLD_SIZE": "4", "LOCAL_RANK": "3"}) == (3, 4)
    assert devices.launch_rank({"WORLD_SIZE": "1", "LOCAL_RANK": "0"}) == (None, 1)
    assert devices.launch_rank({}) == (None, 1)


# --- the pad token ---------------------------------------------------------------------------


@pytest.fixture
def im_start_eos(tiny_lm_path: Path, tmp_path: Path) -> Path:
    """The tiny LM saved as the GGUF conversion left SmolLM2 under transformers 5.17: end of
    sequence ``<|im_start|>``, no pad token."""
    from transformers import AutoTokenizer

    folder = tmp_path / "im-start-eos"
    shutil.copytree(tiny_lm_path, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
    tokenizer.save_pretrained(folder)
    return folder


def test_a_pad_token_the_chat_template_writes_is_named_with_its_fix(tiny_lm_path: Path, im_start_eos: Path) -> None:
    from transformers import AutoTokenizer

    assert pad_problem(AutoTokenizer.from_pretrained(tiny_lm_path), str(tiny_lm_path)) is None
    check_folder_pad(str(tiny_lm_path))
    with pytest.raises(PadTokenError) as caught:
        check_folder_pad(str(im_start_eos))
    text = str(caught.value)
    assert "\n" not in text and str(im_start_eos) in text and "'<|im_start|>'" in text
    assert '"pad_token": "<|endoftext|>"' in text and "tokenizer_config.json" in text
    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_path)
    tokenizer.pad_token = "<|im_end|>"  # ends every turn: masked as padding just the same
    assert "'<|im_end|>'" in pad_problem(tokenizer, "m")


def test_training_refuses_it_before_the_trainer_starts(im_start_eos: Path, tmp_path: Path) -> None:
    from embodied_r.checks.steps import write_records
    from embodied_r.training.config import GRPOStageConfig, SFTConfig, TrainingConfig
    from embodied_r.training.sft import run_sft
    from embodied_r.training.stage import run_training_stage

    records = write_records(tmp_path / "records", 4)
    stage = GRPOStageConfig(name="s", rewards={"format": 1.0})
    cfg = TrainingConfig(use_cpu=True, num_generations=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
                         max_completion_length=8, max_steps_per_stage=1, stages=[stage], learning_rate=1e-4)
    with pytest.raises(PadTokenError, match="im-start-eos"):
        run_training_stage(records, str(im_start_eos), tmp_path / "grpo", stage, cfg)
    with pytest.raises(PadTokenError, match="im-start-eos"):
        run_sft(records, str(im_start_eos), tmp_path / "sft", SFTConfig(use_cpu=True, max_steps=1))
    assert not any((tmp_path / name).exists() for name in ("grpo", "sft", "grpo.partial", "sft.partial"))


def test_a_backend_pads_with_a_safe_token_and_says_so(im_start_eos: Path, caplog) -> None:
    from embodied_r.backends.hf_local import TransformersBackend

    with caplog.at_level(logging.WARNING):
        backend = TransformersBackend(BackendConfig(model=str(im_start_eos), device="cpu", max_new_tokens=2))
    assert backend.tokenizer.pad_token == "<|endoftext|>"
    assert any(str(im_start_eos) in r.getMessage() and "<|endoftext|>" in r.getMessage() for r in caplog.records)
    backend.close()


# --- memory per GPU --------------------------------------------------------------------------


def test_the_shape_counts_the_parameters_the_model_has(tiny_lm_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    shape = shapes.shape_of(str(tiny_lm_path))
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_path)
    assert shape.parameters() == sum(p.numel() for p in model.parameters())
    assert shapes.KNOWN_SHAPES["Qwen/Qwen2.5-VL-3B-Instruct"].parameters() == pytest.approx(3.09e9, rel=0.01)
    assert shapes.KNOWN_SHAPES["Qwen/Qwen2.5-0.5B-Instruct"].parameters() == pytest.approx(0.494e9, rel=0.01)


def test_memory_per_recipe_counts_the_kl_reference_as_a_second_copy() -> None:
    shape = shapes.KNOWN_SHAPES["Qwen/Qwen2.5-VL-3B-Instruct"]
    params = shape.parameters()
    paper = memory.estimate(load_recipe("paper").training, shape)
    # DDP with a plain AdamW: fp32 weights, a full fp32 reference, fp32 gradients, Adam's two moments.
    assert (paper.parts["policy"], paper.parts["reference"], paper.parts["gradients"]) == (4 * params,) * 3
    assert paper.parts["optimizer"] == 8 * params
    assert paper.peak > 20 * params  # more than the 16 bytes a parameter the README once said
    eight = memory.estimate(load_recipe("paper-8gpu").training, shape)
    assert eight.parts["policy"] == eight.parts["reference"] == 2 * params / 8  # ZeRO-3 shards 16-bit copies
    assert eight.card_share == 0.25 and eight.parts["generation"] == 0
    single = memory.estimate(load_recipe("single-gpu").training, shape)
    assert single.parts["reference"] == 0  # LoRA: the base with adapters off is the reference
    assert single.parts["consistency_reference"] == 2 * (params + shape.vision_parameters)
    # Stages 1 and 2 weigh consistency 0: their reference is never loaded, nor counted.
    first_two = load_recipe("single-gpu").training
    first_two = first_two.model_copy(update={"stages": first_two.stages[:2]})
    assert "consistency_reference" not in memory.estimate(first_two, shape).parts
    # The one measurement (H200, 0.5B-shaped policy at the paper's settings): 11.7 GiB.
    measured = memory.estimate(load_recipe("paper").training, shapes.KNOWN_SHAPES["Qwen/Qwen2.5-0.5B-Instruct"],
                               prompt_tokens=950, completion_tokens=512)
    assert measured.peak / memory.GIB == pytest.approx(11.7, rel=0.1)
    longer = memory.estimate(load_recipe("paper").training, shape, prompt_tokens=950, completion_tokens=1024)
    assert longer.parts["activations"] < memory.estimate(load_recipe("paper").training, shape).parts["activations"]


def test_memory_table_lists_the_recipes_with_known_policies() -> None:
    from embodied_r.checks.gpu import memory_table

    text = memory_table(["paper", "paper-8gpu", "single-gpu", "smoke"])
    table, verdicts = text.split("\n\n")
    lines = table.splitlines()
    assert lines[0].startswith("| recipe | processes | policy | reference |") and len(lines) == 5
    assert "of the card (vLLM)" in next(line for line in lines if line.startswith("| paper-8gpu "))
    assert not any(line.startswith("| smoke ") for line in lines)  # tiny:lm's shape is not known before it is built
    assert [line.split(":")[0] for line in verdicts.splitlines()] == ["paper", "paper-8gpu", "single-gpu"]
    json.dumps(memory.estimate(load_recipe("paper").training, shapes.KNOWN_SHAPES["Qwen/Qwen2.5-VL-3B-Instruct"]).gib())


# --- precision in the Embodied-Reasoner SFT --------------------------------------------------


@pytest.mark.slow
def test_reasoner_sft_in_bf16_moves_the_weights_at_a_small_learning_rate(tiny_vlm_path: Path, tmp_path: Path) -> None:
    """One step at lr 1e-6 with bf16 on: fp32 weights under autocast move by about 1e-6 each.
    bf16 weights under a plain AdamW would not: an update below 1/256 of a weight rounds
    away (here the weights are about 0.2, the update 1e-6)."""
    from PIL import Image
    from safetensors.torch import load_file

    from embodied_r.interactive.prompts import IMAGE
    from embodied_r.interactive.sft_config import ReasonerSFTConfig
    from embodied_r.interactive.stages import run_sft_stage

    image = tmp_path / "frame.png"
    Image.new("RGB", (56, 56), (30, 160, 90)).save(image)
    data = tmp_path / "explore"
    data.mkdir()
    conversation = {"id": "t1", "images": [str(image)], "messages": [
        {"role": "system", "content": "You act in a house."},
        {"role": "user", "content": f"{IMAGE}Pick up the apple."},
        {"role": "assistant", "content": "<DecisionMaking>navigate to apple</DecisionMaking>"}]}
    (data / "trajectories.json").write_text(json.dumps([conversation]))
    cfg = ReasonerSFTConfig(use_cpu=True, bf16=True, learning_rate=1e-6, max_steps=1, warmup_ratio=0.0,
                            lr_scheduler_type="constant", max_pixels=56 * 56, max_length=4096, save_steps=1000,
                            gradient_checkpointing=False)
    assert not cfg.bf16_weights(True)  # no DeepSpeed, no LoRA: the weights must stay fp32
    summary = run_sft_stage(tmp_path / "sft", {"sft": cfg.model_dump(mode="json"), "stage": 2, "name": "check"},
                            {"trajectories": str(data), "init_model": str(tiny_vlm_path)})
    assert summary["steps"] == 1
    before = load_file(str(tiny_vlm_path / "model.safetensors"))
    after = load_file(str(tmp_path / "sft" / "model" / "model.safetensors"))
    layers = [k for k in before if ".layers." in k and "visual" not in k and k.endswith("proj.weight")]
    assert layers
    # Against the starting weights in the dtype they were trained in: a cast alone moves nothing.
    moved = sum(int((after[k] != before[k].to(after[k].dtype)).sum()) for k in layers)
    total = sum(before[k].numel() for k in layers)
    assert moved / total > 0.9, f"only {moved} of {total} language-model weights moved"
