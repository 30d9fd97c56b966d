"""A GRPO stage with LoRA on the CPU: the adapter is kept, the merged weights are the model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("peft")

from embodied_r.config import load_recipe  # noqa: E402
from embodied_r.training.config import GRPOStageConfig
from embodied_r.training.environment import LoraSettings
from embodied_r.training.stage import run_training_stage  # noqa: E402
from tests.training.test_training import records, tiny_cfg  # noqa: E402,F401 - the records fixture is shared


def _weights(folder: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_lora_stage_saves_adapter_and_merged_model(records: Path, tmp_path: Path, tiny_lm_path: Path) -> None:  # noqa: F811
    import torch
    from transformers import AutoModelForCausalLM

    stage = GRPOStageConfig(name="lora", rewards={"format": 0.5, "accuracy": 0.5})
    # The single-gpu recipe's target pattern: the language model's projections only.
    target = load_recipe("single-gpu").training.lora.target_modules
    # A random (not identity) adapter, so the merged weights differ from the base even
    # when the tiny model earns no reward to learn from.
    lora = LoraSettings(r=4, alpha=8, dropout=0.0, target_modules=target, init_lora_weights=False)
    cfg = tiny_cfg([stage], lora=lora, max_steps_per_stage=2)
    out = tmp_path / "lora"
    summary = run_training_stage(records, "tiny:lm", out, stage, cfg)
    assert summary["lora"] is True and summary["steps"] == 2

    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["peft_type"] == "LORA"
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    # model/ is a plain full model: no adapter files, no LoRA tensors, loadable as it is.
    assert not (out / "model" / "adapter_config.json").exists()
    merged = _weights(out / "model")
    assert not any("lora_" in name for name in merged)
    model = AutoModelForCausalLM.from_pretrained(str(out / "model"))
    assert model.config.model_type == "qwen2"
    assert (out / "model" / "tokenizer.json").is_file()

    # The adapted projections differ from the base, nothing else does, and model/ is
    # exactly the base with the saved adapter merged in.
    from peft import PeftModel

    base = _weights(tiny_lm_path)
    assert set(base) == set(merged)
    changed = {n for n in base if not torch.equal(base[n], merged[n])}
    assert len(changed) == 14 and all(re.search(r"(q|k|v|o|gate|up|down)_proj\.weight$", n) for n in changed)
    again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_lm_path)),
                                      str(out / "adapter")).merge_and_unload().state_dict()
    for name in changed:
        torch.testing.assert_close(again[name], merged[name])


def test_lora_target_pattern_skips_the_vision_tower(tiny_vlm_path: Path, tiny_lm_path: Path) -> None:
    """On a Qwen2.5-VL policy the pattern adapts the language model, not the vision blocks."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    pattern = load_recipe("single-gpu").training.lora.target_modules
    vlm = AutoModelForImageTextToText.from_pretrained(str(tiny_vlm_path))
    hit = [n for n, _ in vlm.named_modules() if re.fullmatch(pattern, n)]
    assert hit and not any("visual" in n for n in hit)
    assert any(n.endswith("mlp.gate_proj") for n in hit) and any(n.endswith("self_attn.q_proj") for n in hit)
    lm = AutoModelForCausalLM.from_pretrained(str(tiny_lm_path))
    # 2 layers x (4 attention + 3 MLP projections).
    assert len([n for n, _ in lm.named_modules() if re.fullmatch(pattern, n)]) == 14
