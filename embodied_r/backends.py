"""Model access, shared by perception, the consistency reward and evaluation.

One interface, three backends chosen in config:
- ``transformers``: the model in this process (CPU or GPU);
- ``openai``: any OpenAI-compatible HTTP endpoint (``vllm serve``, a hosted API,
  ``transformers serve``);
- ``vllm``: vLLM in this process (GPU, separate environment).

Conversations use the OpenAI chat format. An image part is
``{"type": "image", "path": "/abs/file.jpg"}``; backends translate it to what their
model takes (pixels in process, a JPEG data URL over HTTP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

Message = dict[str, Any]
Conversation = list[Message]


class BackendConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["transformers", "openai", "vllm"] = "transformers"
    # A local folder, a hub id (only with a download stage) or, for ``openai``, the served name.
    model: str = ""
    base_url: str | None = None  # openai: e.g. http://127.0.0.1:8000/v1
    api_key_env: str = "OPENAI_API_KEY"  # name of the variable; the key itself is never stored
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    concurrency: int = Field(8, ge=1)
    timeout_s: float = 120.0
    max_retries: int = Field(5, ge=0)
    batch_size: int = Field(8, ge=1)  # transformers: prompts per forward pass
    device: str = "auto"  # transformers: "cpu", "cuda", "auto"
    max_pixels: int = 448 * 448  # images are resized to this budget before they are sent
    seed: int = 0


@dataclass
class Generation:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # set when the call failed after its retries; text is then ""


class Backend(Protocol):
    def generate(self, conversations: list[Conversation]) -> list[Generation]:
        """One generation per conversation, in order. Never raises for one bad item:
        a failed item comes back with ``error`` set."""

    def close(self) -> None: ...


class BackendUnavailable(RuntimeError):
    """The backend's packages are not installed in this environment."""


def make_backend(cfg: BackendConfig) -> Backend:
    if cfg.kind == "transformers":
        from embodied_r.backend_transformers import TransformersBackend

        return TransformersBackend(cfg)
    if cfg.kind == "openai":
        from embodied_r.backend_openai import OpenAIBackend

        return OpenAIBackend(cfg)
    if cfg.kind == "vllm":
        try:
            from embodied_r.backend_vllm import VLLMBackend
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise BackendUnavailable(
                "backend 'vllm' needs vLLM, which cannot share the base environment "
                "(it pins its own torch and transformers). Install the inference "
                "environment: `make env-vllm` (see README, 'Environments')."
            ) from exc
        return VLLMBackend(cfg)
    raise ValueError(f"unknown backend kind {cfg.kind!r}")
