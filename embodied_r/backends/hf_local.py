"""The ``transformers`` backend: a text LM or a Qwen2-VL / Qwen2.5-VL model in this process,
prompts batched with left padding. Reply schemas are accepted and not enforced."""

from __future__ import annotations

import logging
from typing import Any, Callable

from PIL import Image

from embodied_r.backends.base import BackendConfig, Conversation, Generation, decoding, map_image_parts
from embodied_r.backends.devices import cuda_available, inference_dtype, launch_rank, placement
from embodied_r.backends.images import load_image
from embodied_r.backends.models import VLM_CLASSES, load_vlm_processor, resolve_model, vlm_class
from embodied_r.backends.tokens import safe_pad
from embodied_r.backends.truncation import left_truncate

log = logging.getLogger(__name__)

VLM_TYPES = set(VLM_CLASSES)


def split_images(conversation: Conversation, max_pixels: int,
                 encoding: str = "jpeg-bilinear") -> tuple[Conversation, list[Image.Image]]:
    """The conversation with bare image placeholders, and the loaded images in order."""
    images: list[Image.Image] = []

    def placeholder(path: str) -> dict[str, Any]:
        images.append(load_image(path, max_pixels, encoding))
        return {"type": "image"}

    out = map_image_parts(conversation, placeholder)
    for message in out:
        if not isinstance(message["content"], str):
            for part in message["content"]:
                if part.get("type") not in ("image", "text"):
                    raise ValueError(f"unsupported content part type {part.get('type')!r}")
    return out, images


class TransformersBackend:
    def __init__(self, cfg: BackendConfig):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        if not cfg.model:
            raise ValueError("backend 'transformers' needs `model`: a local folder, a hub id or tiny:lm / tiny:vlm")
        self.cfg = cfg
        self.path = resolve_model(cfg.model)
        config = AutoConfig.from_pretrained(self.path)
        self.is_vlm = config.model_type in VLM_TYPES
        if not self.is_vlm and hasattr(config, "vision_config"):
            raise ValueError(f"{self.path}: vision-language model type {config.model_type!r} is not supported by the "
                             f"transformers backend (supported: {sorted(VLM_TYPES)}); use the openai or vllm backend "
                             "for it")
        self.device, device_map = placement(cfg.device, cuda_available(), launch_rank()[0])
        on_gpu = self.device.startswith("cuda")
        load_kwargs: dict[str, Any] = {"dtype": getattr(torch, inference_dtype(on_gpu))}
        if device_map is not None:
            load_kwargs["device_map"] = device_map
        if self.is_vlm:
            self.processor = load_vlm_processor(self.path)
            self.tokenizer = self.processor.tokenizer
            self.model = vlm_class(self.path).from_pretrained(self.path, **load_kwargs)
        else:
            self.processor = None
            self.tokenizer = AutoTokenizer.from_pretrained(self.path)
            self.model = AutoModelForCausalLM.from_pretrained(self.path, **load_kwargs)
        if "device_map" not in load_kwargs:
            self.model.to(self.device)
        self.model.eval()
        self.tokenizer.padding_side = "left"
        safe_pad(self.tokenizer, self.path)
        self.stop_ids = self._stop_ids()
        # Resolved once, here where the model's generation_config is known.
        self.decoding = decoding(cfg, self.model.generation_config)
        self._batches = 0

    def _stop_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return set(ids)

    def _prepare(self, conversation: Conversation) -> tuple[str, list[Image.Image], bool]:
        """The templated prompt, its images, and whether the prompt was cut."""
        messages, images = split_images(conversation, self.cfg.max_pixels, self.cfg.image_encoding)
        if images and not self.is_vlm:
            raise ValueError(f"{self.path} is a text model; it cannot take images")
        template_owner = self.processor if self.is_vlm else self.tokenizer
        text = template_owner.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        cut = 0
        if self.cfg.max_prompt_tokens is not None and not images:
            # Image placeholders must stay whole, so only text prompts are cut.
            [text], cut = left_truncate([text], self.tokenizer, self.cfg.max_prompt_tokens)
        return text, images, bool(cut)

    def _encode(self, items: list[tuple[str, list[Image.Image]]]) -> Any:
        texts = [text for text, _ in items]
        if self.is_vlm:
            images = [img for _, imgs in items for img in imgs]
            # The processor rounds sizes to whole patches; with the budget it rounds down.
            extra = {}
            if images:
                floor = self.processor.image_processor.size.get("shortest_edge", 28 * 28)
                extra["size"] = {"longest_edge": self.cfg.max_pixels, "shortest_edge": min(floor, self.cfg.max_pixels)}
            return self.processor(text=texts, images=images or None, return_tensors="pt", padding=True, **extra)
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def _run_batch(self, items: list[tuple[str, list[Image.Image]]], max_new_tokens: int) -> list[Generation]:
        import torch

        batch = self._encode(items).to(self.model.device)
        sampling = self.cfg.temperature > 0
        kwargs: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": sampling,
                                  "pad_token_id": self.tokenizer.pad_token_id}
        if "repetition_penalty" in self.decoding:
            # Applied in greedy decoding too, as transformers and ms-swift apply it.
            kwargs["repetition_penalty"] = self.decoding["repetition_penalty"]
        if sampling:
            kwargs.update(temperature=self.cfg.temperature, top_p=self.cfg.top_p)
            if "top_k" in self.decoding:
                kwargs["top_k"] = self.decoding["top_k"] or None  # 0: off
            # Seeded per batch, so a rerun with the same inputs draws the same samples.
            torch.manual_seed(self.cfg.seed + self._batches)
        else:
            # Sampling settings in a model's generation config would only raise warnings.
            kwargs.update(temperature=None, top_p=None, top_k=None)
        self._batches += 1
        with torch.inference_mode():
            out = self.model.generate(**batch, **kwargs)
        prompt_len = batch["input_ids"].shape[1]
        prompt_tokens = batch["attention_mask"].sum(dim=1).tolist()
        results = []
        for row, n_prompt in zip(out[:, prompt_len:].tolist(), prompt_tokens):
            stop = next((i + 1 for i, tok in enumerate(row) if tok in self.stop_ids), len(row))
            text = self.tokenizer.decode(row[:stop], skip_special_tokens=True)
            results.append(Generation(text=text, prompt_tokens=int(n_prompt), completion_tokens=stop))
        return results

    def generate(self, conversations: list[Conversation], *, schemas: list[dict[str, Any] | None] | None = None,
                 max_new_tokens: int | None = None, on_result: Callable[[int, Generation], None] | None = None
                 ) -> list[Generation]:
        """``on_result`` is called as each batch finishes; ``schemas`` are not enforced."""
        budget = max_new_tokens or self.cfg.max_new_tokens
        results: list[Generation | None] = [None] * len(conversations)

        def finish(i: int, gen: Generation) -> None:
            results[i] = gen
            if on_result is not None:
                on_result(i, gen)

        ready: list[tuple[int, tuple[str, list[Image.Image]]]] = []
        cut: set[int] = set()
        for i, conversation in enumerate(conversations):
            try:
                text, images, was_cut = self._prepare(conversation)
            except Exception as exc:  # one bad item must not sink the batch
                finish(i, Generation(text="", error=f"prepare: {type(exc).__name__}: {exc}"))
                continue
            ready.append((i, (text, images)))
            if was_cut:
                cut.add(i)
        # Similar lengths together waste less compute on padding.
        ready.sort(key=lambda item: len(item[1][0]))
        size = self.cfg.batch_size
        for start in range(0, len(ready), size):
            chunk = ready[start : start + size]
            try:
                outs = self._run_batch([item for _, item in chunk], budget)
            except Exception as exc:
                if len(chunk) == 1:
                    finish(chunk[0][0], Generation(text="", error=f"generate: {type(exc).__name__}: {exc}"))
                    continue
                # Retry one by one so only the culprit fails (e.g. out of memory).
                log.warning("batch of %d failed (%s); retrying items singly", len(chunk), exc)
                outs = []
                for _, item in chunk:
                    try:
                        outs.extend(self._run_batch([item], budget))
                    except Exception as one_exc:
                        outs.append(Generation(text="", error=f"generate: {type(one_exc).__name__}: {one_exc}"))
            for (i, _), gen in zip(chunk, outs):
                gen.prompt_truncated = i in cut
                finish(i, gen)
        return [r if r is not None else Generation(text="", error="not generated") for r in results]

    def close(self) -> None:
        on_gpu = self.device.startswith("cuda")
        self.model = None
        self.processor = None
        if on_gpu:
            import gc

            import torch

            # Perception, reward and evaluation models share one GPU in turn.
            gc.collect()
            torch.cuda.empty_cache()
