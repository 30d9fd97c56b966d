"""Model references (a folder, a hub id, ``smol:135m`` or ``tiny:<name>``) and the folders they
name; for Qwen2 / Qwen2.5-VL folders, the chat markers, the VL class and a processor without
torchvision; building a model folder atomically."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

from embodied_r.backends.smol import SMOL_REF, resolve_smol
from embodied_r.paths import home

TINY_PREFIX = "tiny:"
# The demo's table, by module name: this package imports nothing of the demo's, and only a
# stage that names a tiny model hashes its builder (the stage keys read this table).
BY_NAME = {TINY_PREFIX: "embodied_r.demo.models:resolve"}

# Qwen2's chat markers and Qwen2.5-VL's vision placeholders.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"


def resolve_model(ref: str) -> str:
    if ref.startswith(TINY_PREFIX):
        module, function = BY_NAME[TINY_PREFIX].split(":")
        return str(getattr(importlib.import_module(module), function)(ref, home() / "models"))
    if ref == SMOL_REF:
        return resolve_smol(home())
    if _looks_like_a_path(ref) and not Path(ref).expanduser().exists():
        # Else transformers reads it as a hub id and answers "Repo id must be in the form ...".
        raise FileNotFoundError(f"model folder {ref} does not exist: give a model folder that does, a hub id "
                                "(org/name), tiny:<name> or models:/<name>@<alias>")
    return ref


def _looks_like_a_path(ref: str) -> bool:
    """A hub id is ``name`` or ``org/name``; anything else with a slash is a folder."""
    return ref.startswith(("/", "./", "../", "~")) or ref.count("/") > 1 or ref.endswith("/")


def build_atomically(final: Path, build: Callable[[Path], None]) -> Path:
    """A folder that already holds a ``config.json`` is returned as it is."""
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir()
    try:
        build(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process finished the same build first; its folder is equivalent.
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _processor_class() -> type:
    from transformers import Qwen2_5_VLProcessor

    class _ImageOnlyProcessor(Qwen2_5_VLProcessor):
        """Qwen2.5-VL's processor without its video processor, which needs torchvision."""

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            from transformers.processing_utils import ProcessorMixin

            self.image_token = getattr(tokenizer, "image_token", None) or IMAGE_PAD
            self.video_token = getattr(tokenizer, "video_token", None) or VIDEO_PAD
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
            ProcessorMixin.__init__(self, image_processor, tokenizer, None, chat_template=chat_template)

    return _ImageOnlyProcessor


def load_vlm_processor(path: str | Path) -> Any:
    """Without torchvision, which ``AutoProcessor`` would insist on for the video processor."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(path))
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.padding_side = "left"
    template = tokenizer.chat_template
    chat_file = Path(path) / "chat_template.json"
    if not template and chat_file.is_file():
        template = json.loads(chat_file.read_text())["chat_template"]
    return _processor_class()(image_processor, tokenizer, chat_template=template)


# Embodied-Reasoner's released models are Qwen2-VL, Embodied-R's perceiver Qwen2.5-VL; the
# checkpoint's config decides, as the classes cannot load each other's weights.
VLM_CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration"}


def vlm_class(path: str | Path) -> type:
    import transformers

    config = Path(path) / "config.json"
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {config} ({exc}): give the folder of a Qwen2-VL or Qwen2.5-VL "
                         "checkpoint") from None
    if model_type not in VLM_CLASSES:
        raise ValueError(f"{path}: model_type {model_type!r} is not a VL model this project loads; "
                         f"give a checkpoint of {' or '.join(VLM_CLASSES)}")
    return getattr(transformers, VLM_CLASSES[model_type])
