"""The policy as the trainer loads it: a causal LM folder, and its tokenizer. A Qwen2.5-VL
policy is reduced to its language model (same weights and tokenizer, ``Qwen2ForCausalLM``):
its vision tower would never see an input yet cost every step, optimizer state and checkpoint,
and on text its multimodal rotary positions are plain rotary embedding (same logits)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from embodied_r.backends.models import VLM_CLASSES, build_atomically, resolve_model
from embodied_r.paths import home

log = logging.getLogger(__name__)

VL_MODEL_TYPES = frozenset(VLM_CLASSES)  # the VL checkpoints whose text model a policy starts from
# The text model's keys in a Qwen2.5-VL checkpoint, in the hub's layout and in the layout
# recent transformers keep in memory; the vision tower's keys are dropped.
_PREFIXES = (("model.language_model.", "model."), ("model.", "model."), ("lm_head.", "lm_head."))
_VISION = ("visual.", "model.visual.")
_COPY = ("generation_config.json",)
_TEXT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "hidden_act",
                "attention_dropout", "use_sliding_window", "sliding_window", "max_window_layers",
                "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id")


def model_type(path: Path) -> str | None:
    config = Path(path) / "config.json"
    return json.loads(config.read_text()).get("model_type") if config.is_file() else None


def _local(ref: str, weights: bool = False) -> Path | None:
    resolved = Path(resolve_model(ref)).expanduser()
    if resolved.exists():
        return resolved
    patterns = ["*.json", "*.txt", "*.jinja"] + (["*.safetensors"] if weights else [])
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(ref, allow_patterns=patterns))
    except Exception as exc:  # noqa: BLE001 - the trainer reports a missing model itself
        log.warning("cannot fetch %s from the hub: %s", ref, exc)
        return None


def text_config(src: Path) -> Any:
    from transformers import AutoConfig, Qwen2Config

    full = AutoConfig.from_pretrained(str(src))
    text = full.get_text_config().to_dict()
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    theta = rope.get("rope_theta", text.get("rope_theta", 1_000_000.0))
    kwargs = {k: text[k] for k in _TEXT_FIELDS if text.get(k) is not None}
    tie = getattr(full, "tie_word_embeddings", None)
    if tie is None:
        tie = text.get("tie_word_embeddings", False)
    return Qwen2Config(**kwargs, tie_word_embeddings=bool(tie),
                       rope_parameters={"rope_type": "default", "rope_theta": float(theta)},
                       architectures=["Qwen2ForCausalLM"])


def _rename(key: str) -> str | None:
    if key.startswith(_VISION):
        return None
    for old, new in _PREFIXES:
        if key.startswith(old):
            return new + key[len(old):]
    return None


def extract_language_model(src: Path, dest: Path) -> Path:
    """Shard by shard: never the whole model in memory."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    def build(folder: Path) -> None:
        text_config(src).save_pretrained(str(folder))
        shards = sorted(Path(src).glob("*.safetensors"))
        if not shards:
            raise FileNotFoundError(f"{src} holds no .safetensors weights to extract the language model from")
        weight_map: dict[str, str] = {}
        total = 0
        for i, shard in enumerate(shards, 1):
            tensors = {}
            with safe_open(str(shard), framework="pt") as fh:
                for key in fh.keys():
                    name = _rename(key)
                    if name is not None:
                        tensors[name] = fh.get_tensor(key)
            name = "model.safetensors" if len(shards) == 1 else f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(tensors, str(folder / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in tensors})
            total += sum(t.numel() * t.element_size() for t in tensors.values())
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        load_tokenizer(str(src)).save_pretrained(str(folder))
        for name in _COPY:
            if (Path(src) / name).is_file():
                shutil.copy2(Path(src) / name, folder / name)
        (folder / "extracted_from.json").write_text(json.dumps({"source": str(src)}, indent=2))

    return build_atomically(dest, build)


def _fingerprint(src: Path) -> str:
    h = hashlib.sha256((Path(src) / "config.json").read_bytes())
    for shard in sorted(Path(src).glob("*.safetensors")):
        h.update(f"{shard.name}:{shard.stat().st_size}".encode())
    return h.hexdigest()[:12]


def training_model(ref: str) -> str:
    """What the trainer loads: a Qwen2.5-VL model's language model, extracted once under
    ``$EMBODIED_R_HOME/models``; any other reference as it is (``tiny:*`` built)."""
    resolved = resolve_model(ref)
    if Path(resolved).expanduser().exists():
        src: Path | None = Path(resolved).expanduser()
    elif "/" in ref and not ref.startswith((".", "/", "~")):
        src = _local(ref)  # a hub id: its config decides, before any weights are fetched
    else:
        src = None
    if src is None or model_type(src) not in VL_MODEL_TYPES:
        return resolved
    if not any(src.glob("*.safetensors")):
        src = _local(ref, weights=True) or src
    name = Path(str(ref).rstrip("/")).name.replace(":", "-")
    dest = home() / "models" / f"lm-of-{name}-{_fingerprint(src)}"
    if not (dest / "config.json").is_file():
        log.info("policy %s is a vision-language model: training its language model, extracted to %s", ref, dest)
    return str(extract_language_model(src, dest))


def prompt_ids(tok: Any, prompt: list[dict[str, Any]] | str) -> list[int]:
    """A prompt's token ids as the trainer sees it: cut (chat-templated text) as it is, a
    conversation through the chat template with the generation prompt."""
    if isinstance(prompt, str):
        return tok(prompt, add_special_tokens=False)["input_ids"]
    ids = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    return ids["input_ids"] if hasattr(ids, "keys") else ids  # a BatchEncoding in recent transformers


def load_tokenizer(ref: str) -> Any:
    # A Qwen2.5-VL folder may keep the chat template beside the processor, not in the tokenizer.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(ref))
    if not getattr(tok, "chat_template", None):
        folder = _local(ref)
        for name in ("chat_template.jinja", "chat_template.json"):
            path = folder / name if folder is not None else None
            if path is not None and path.is_file():
                text = path.read_text()
                tok.chat_template = json.loads(text)["chat_template"] if name.endswith(".json") else text
                break
    return tok
