"""The ``vllm`` backend: vLLM's offline engine in this process (GPU), imported only when a
backend is built; one ``LLM.chat`` call hands the scheduler the whole list."""

from __future__ import annotations

import gc
import importlib
import json
import logging
from pathlib import Path
from typing import Any, Callable

from embodied_r.backends.base import BackendConfig, Conversation, Generation, decoding, map_image_parts
from embodied_r.backends.images import load_image
from embodied_r.backends.models import resolve_model
from embodied_r.errors import BackendUnavailable

log = logging.getLogger(__name__)

INSTALL_HINT = ("backend 'vllm' needs the vllm package, which pins its own torch and transformers and so cannot "
                "share the base environment. Make a separate environment for it (README, 'vLLM in process'): "
                "install vllm first, then this package with `pip install --no-deps -e .` and its other "
                "requirements; or serve the model with `vllm serve MODEL --host 127.0.0.1` and use backend kind "
                "'openai' with its base_url.")
# A per_video pass shows a window of key frames (at most 32), plus headroom.
MAX_IMAGES_PER_PROMPT = 40


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise BackendUnavailable(INSTALL_HINT) from exc
    return vllm


def to_vllm_messages(conversation: Conversation, max_pixels: int,
                     encoding: str = "jpeg-bilinear") -> list[dict[str, Any]]:
    return map_image_parts(conversation,
                           lambda path: {"type": "image_pil", "image_pil": load_image(path, max_pixels, encoding)})


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def engine_kwargs(cfg: BackendConfig, gpus: int) -> dict[str, Any]:
    """Tensor parallelism spans the largest power of two of the visible GPUs (attention heads
    divide evenly); the config's ``engine_kwargs`` override."""
    tp = 1
    while tp * 2 <= gpus:
        tp *= 2
    kwargs: dict[str, Any] = {
        "model": resolve_model(cfg.model), "seed": cfg.seed, "tensor_parallel_size": tp,
        "limit_mm_per_prompt": {"image": MAX_IMAGES_PER_PROMPT},
        # The processor's budget matches ours, so vLLM's memory profiling reserves no room for larger images.
        "mm_processor_kwargs": {"max_pixels": cfg.max_pixels},
    }
    kwargs.update(getattr(cfg, "engine_kwargs", None) or {})
    return kwargs


def model_generation_config(path: str) -> dict[str, Any]:
    """vLLM's ``SamplingParams`` take every value explicitly, so the model's own are read here."""
    file = Path(path) / "generation_config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


class VLLMBackend:
    def __init__(self, cfg: BackendConfig):
        vllm = import_vllm()
        if not cfg.model:
            raise ValueError("backend 'vllm' needs `model`: a local folder or a hub id")
        self.cfg = cfg
        self._vllm = vllm
        kwargs = engine_kwargs(cfg, _gpu_count())
        self.path = kwargs["model"]
        self.llm = vllm.LLM(**kwargs)
        self.retry_log: list[tuple[str, float]] = []  # vLLM in process never retries
        self.decoding = decoding(cfg, model_generation_config(self.path))
        self._requests = 0

    def _sampling(self, index: int, schema: dict[str, Any] | None, max_new_tokens: int) -> Any:
        kwargs: dict[str, Any] = {"max_tokens": max_new_tokens, "temperature": self.cfg.temperature}
        if "repetition_penalty" in self.decoding:
            kwargs["repetition_penalty"] = self.decoding["repetition_penalty"]
        if self.cfg.temperature > 0:
            # A seed per request: a rerun of the same calls draws the same samples
            # whatever the batch, and two equal prompts still draw different ones.
            kwargs.update(top_p=self.cfg.top_p, seed=self.cfg.seed + self._requests + index)
            if "top_k" in self.decoding:
                kwargs["top_k"] = self.decoding["top_k"] or -1  # vLLM's "off"
        if schema is not None:
            kwargs.update(structured_kwargs(self._vllm, schema))
        return self._vllm.SamplingParams(**kwargs)

    def _chat(self, messages: list[list[dict[str, Any]]], params: list[Any]) -> list[Generation]:
        outputs = self.llm.chat(messages, sampling_params=params, use_tqdm=False)
        return [generation_from_output(out) for out in outputs]

    def generate(self, conversations: list[Conversation], *, schemas: list[dict[str, Any] | None] | None = None,
                 max_new_tokens: int | None = None, on_result: Callable[[int, Generation], None] | None = None
                 ) -> list[Generation]:
        """``on_result`` is called for each once vLLM returns the batch."""
        budget = max_new_tokens or self.cfg.max_new_tokens
        schemas = list(schemas) if schemas is not None else [None] * len(conversations)
        results: list[Generation | None] = [None] * len(conversations)
        ready: list[tuple[int, list[dict[str, Any]], Any]] = []
        for i, conversation in enumerate(conversations):
            try:
                messages = to_vllm_messages(conversation, self.cfg.max_pixels, self.cfg.image_encoding)
                ready.append((i, messages, self._sampling(i, schemas[i], budget)))
            except Exception as exc:  # one bad item must not sink the batch
                results[i] = Generation(text="", error=f"prepare: {type(exc).__name__}: {exc}")
        self._requests += len(conversations)
        if ready:
            try:
                outs = self._chat([m for _, m, _ in ready], [p for _, _, p in ready])
            except Exception as exc:
                # vLLM rejects a whole request list for one bad prompt (e.g. one longer
                # than the model's context): retry singly so only the culprit fails.
                log.warning("vLLM batch of %d failed (%s); retrying items singly", len(ready), exc)
                outs = []
                for _, messages, params in ready:
                    try:
                        outs.extend(self._chat([messages], [params]))
                    except Exception as one_exc:
                        outs.append(Generation(text="", error=f"generate: {type(one_exc).__name__}: {one_exc}"))
            for (i, _, _), gen in zip(ready, outs):
                results[i] = gen
        final = [r if r is not None else Generation(text="", error="not generated") for r in results]
        if on_result is not None:
            for i, gen in enumerate(final):
                on_result(i, gen)
        return final

    def close(self) -> None:
        """Release the engine and its GPU memory for the next model of this process."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        try:
            shutdown_engine(llm)
        except Exception as exc:  # pragma: no cover - best effort
            log.warning("vLLM engine shutdown failed: %s", exc)
        del llm
        gc.collect()
        try:
            # Destroys the parallel groups of this process and empties the device cache.
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        except ImportError:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        else:
            cleanup_dist_env_and_memory()


def shutdown_engine(llm: Any) -> str:
    """Stop ``llm``'s engine through the API its vLLM has (in 0.31 only the engine core has
    one); returns which one it used."""
    shutdown = getattr(llm, "shutdown", None)
    if callable(shutdown):
        shutdown()
        return "LLM.shutdown"
    engine = getattr(llm, "llm_engine", None)
    shutdown = getattr(engine, "shutdown", None)
    if callable(shutdown):
        shutdown()
        return "LLMEngine.shutdown"
    shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
    if callable(shutdown):
        shutdown()
        return "engine_core.shutdown"
    log.warning("this vLLM engine has no shutdown; its memory is freed when it is collected")
    return "none"


def structured_kwargs(vllm: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """``structured_outputs``, or ``guided_decoding`` before vLLM 0.12."""
    try:
        params = importlib.import_module("vllm.sampling_params")
    except ImportError:
        params = getattr(vllm, "sampling_params", None)
    structured = getattr(params, "StructuredOutputsParams", None)
    if structured is not None:
        return {"structured_outputs": structured(json=schema)}
    guided = getattr(params, "GuidedDecodingParams", None)
    if guided is not None:
        return {"guided_decoding": guided(json=schema)}
    log.warning("this vLLM has no structured outputs; replies are read as plain text")
    return {}


def generation_from_output(out: Any) -> Generation:
    if not out.outputs:
        return Generation(text="", error="vLLM returned no completion")
    first = out.outputs[0]
    return Generation(text=first.text, prompt_tokens=len(out.prompt_token_ids or []),
                      completion_tokens=len(first.token_ids or []))
