"""The backend protocol: configuration, conversations, generations and the interface.

One interface, three backends chosen in config:
- ``transformers``: the model in this process (CPU or GPU);
- ``openai``: any OpenAI-compatible HTTP endpoint (``vllm serve``, a hosted API,
  ``transformers serve``);
- ``vllm``: vLLM in this process (GPU, separate environment);
- ``world``: the demo's stand-in perceiver (``embodied_r.demo.world_perceiver``), which reports
  the synthetic benchmark's truth; perception only.

Conversations use the OpenAI chat format. An image part is
``{"type": "image", "path": "/abs/file.jpg"}``; backends translate it to what their
model takes (pixels in process, a JPEG data URL over HTTP).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from embodied_r.settings import operational

Message = dict[str, Any]
Conversation = list[Message]


class BackendConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["transformers", "openai", "vllm", "world"] = "transformers"
    # A local folder, a hub id (only with a download stage) or, for ``openai``, the served name.
    model: str = ""
    # Which server answers and how it is asked (operational: the same model behind another
    # URL, more calls in flight or a longer timeout give the same replies).
    base_url: str | None = operational(None)  # openai: e.g. http://127.0.0.1:8000/v1
    api_key_env: str = operational("OPENAI_API_KEY")  # name of the variable; the key itself is never stored
    max_new_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0, allow_inf_nan=False)  # 0 means greedy
    top_p: float = Field(1.0, gt=0, le=1)
    concurrency: int = operational(8, ge=1)
    timeout_s: float = operational(120.0, gt=0, allow_inf_nan=False)
    max_retries: int = operational(5, ge=0)
    batch_size: int = operational(8, ge=1)  # transformers: prompts per forward pass
    device: str = "auto"  # transformers: "cpu", "cuda", "auto"
    max_pixels: int = Field(448 * 448, ge=1)  # images are resized to this budget before they are sent
    seed: int = 0
    # vllm: extra vllm.LLM arguments (tensor_parallel_size, gpu_memory_utilization, max_model_len)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # world: the stand-in perceiver's error rates (``demo.world_perceiver.WorldErrors``).
    world: dict[str, float] = Field(default_factory=dict)

    def unready(self, needs_model: bool = True) -> str | None:
        """What this backend lacks to start in this environment, or None. Checked before a run
        starts (and by ``embodied-r validate``), not minutes in when the stage first calls it."""
        if self.kind != "openai":
            return None
        if not self.base_url and not os.environ.get(self.api_key_env):
            return (f"backend 'openai' needs `base_url` (e.g. http://127.0.0.1:8000/v1) or the API key "
                    f"in the environment variable {self.api_key_env}")
        if needs_model and not self.model:
            return "backend 'openai' needs `model`: the name the server serves the model under"
        return None


@dataclass
class Generation:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # set when the call failed after its retries; text is then ""
    # Why it failed (``embodied_r.faults``): "infra" (the service is down, refuses our key,
    # times out) stops a stage; "item" (this input is bad) is recorded and the stage goes on.
    error_kind: Literal["infra", "item"] | None = None

    @property
    def infra_failed(self) -> bool:
        return self.error is not None and self.error_kind == "infra"


class Backend(Protocol):
    def generate(
        self,
        conversations: list[Conversation],
        *,
        schemas: list[dict[str, Any] | None] | None = None,
        max_new_tokens: int | None = None,
        on_result: Callable[[int, Generation], None] | None = None,
    ) -> list[Generation]:
        """One generation per conversation, in order. Never raises for one bad item:
        a failed item comes back with ``error`` set.

        ``schemas``: a JSON schema per conversation for structured output, enforced by the
        openai and vllm backends and ignored by transformers. ``max_new_tokens`` overrides
        the config for this call. ``on_result(index, generation)`` fires once per item as
        it finishes (from another thread for openai), so callers can record each result
        the moment it exists."""

    def close(self) -> None: ...


def map_image_parts(conversation: Conversation, image_part: Callable[[str], dict[str, Any]]) -> Conversation:
    """A copy of ``conversation`` with each ``{"type": "image", "path": ...}`` part replaced by
    ``image_part(path)``, in place so images keep their position; other parts are kept."""
    out: Conversation = []
    for message in conversation:
        content = message["content"]
        if isinstance(content, str):
            out.append(dict(message))
            continue
        parts = []
        for part in content:
            if part.get("type") == "image":
                if "path" not in part:
                    raise ValueError("image part without a 'path'")
                parts.append(image_part(part["path"]))
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return out


class BackendUnavailable(RuntimeError):
    """The backend's packages are not installed in this environment."""
