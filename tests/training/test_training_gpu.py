"""GRPO stages on GPUs: vLLM colocated rollouts and DeepSpeed ZeRO-3, with the tiny LM.

They need a CUDA GPU and the training environment (infra/training/requirements.txt):
the trainer runs in $EMBODIED_R_TRAIN_PYTHON when set, else in this interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from embodied_r.training.config import GRPOStageConfig, VLLMRollouts
from embodied_r.training.environment import PROJECT_ROOT, TRAIN_PYTHON_ENV
from embodied_r.training.stage import run_training_stage
from tests.training.test_training import records, tiny_cfg  # noqa: F401 - the records fixture is shared

pytestmark = pytest.mark.gpu


def _needs(*modules: str) -> None:
    python = os.environ.get(TRAIN_PYTHON_ENV) or sys.executable
    probe = subprocess.run([python, "-c", f"import {', '.join(modules)}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"the training environment ({python}) lacks {', '.join(modules)}")


def test_vllm_colocated_rollouts(records: Path, tmp_path: Path) -> None:  # noqa: F811
    _needs("vllm", "trl")
    stage = GRPOStageConfig(name="vllm", rewards={"format": 0.5, "accuracy": 0.5})
    cfg = tiny_cfg([stage], use_cpu=False, bf16=True, launcher="accelerate",
                   vllm=VLLMRollouts(gpu_memory_utilization=0.2, max_model_length=4096))
    summary = run_training_stage(records, "tiny:lm", tmp_path / "vllm", stage, cfg)
    assert summary["vllm_rollouts"] is True and summary["steps"] == 2
    assert summary["seconds_generation"] > 0
    assert (tmp_path / "vllm" / "model" / "config.json").is_file()


def test_deepspeed_zero3_stage(records: Path, tmp_path: Path) -> None:  # noqa: F811
    import torch

    _needs("deepspeed", "trl")
    gpus = torch.cuda.device_count()
    infra = PROJECT_ROOT / "infra" / "training"
    config = yaml.safe_load((infra / "accelerate-zero3-8gpu.yaml").read_text())
    config.update(num_processes=gpus, gpu_ids="all")
    config["deepspeed_config"]["deepspeed_config_file"] = str(infra / "deepspeed-zero3.json")
    accelerate_config = tmp_path / "accelerate.yaml"
    accelerate_config.write_text(yaml.safe_dump(config))

    stage = GRPOStageConfig(name="zero3", rewards={"format": 0.5, "accuracy": 0.5})
    # Whole groups of 2 generations over all processes.
    cfg = tiny_cfg([stage], use_cpu=False, bf16=True, launcher="accelerate",
                   accelerate_config=str(accelerate_config), per_device_train_batch_size=2)
    summary = run_training_stage(records, "tiny:lm", tmp_path / "zero3", stage, cfg)
    assert summary["steps"] == 2
    from transformers import AutoModelForCausalLM

    # ZeRO-3 gathered the sharded weights into one loadable model.
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "zero3" / "model"))
