"""The backend protocol: its config, conversations (the OpenAI chat format; an image part is
``{"type": "image", "path": "/abs/file.jpg"}``), generations and the interface."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from embodied_r.backends.registry import BY_NAME
from embodied_r.redaction import register_secret_env
from embodied_r.settings import operational

Message = dict[str, Any]
Conversation = list[Message]

GENERATION_CONFIG = "generation_config"
FromModel = Literal["generation_config"]


class BackendConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str = "transformers"  # a word of ``backends.registry.BY_NAME``
    # A local folder, a hub id (only with a download stage) or, for a served kind, the served name.
    model: str = ""
    # Operational: the same model behind another URL, more calls in flight or a longer
    # timeout give the same replies.
    base_url: str | None = operational(None)  # openai: e.g. http://127.0.0.1:8000/v1
    # openai: several servers of the same model, instead of ``base_url`` (``backends.servers``).
    base_urls: list[str] | None = operational(None, min_length=1)
    api_key_env: str = operational("OPENAI_API_KEY")  # name of the variable; the key itself is never stored
    max_new_tokens: int = Field(256, ge=1)
    # transformers: a longer text prompt keeps its last tokens, as the trainer cuts prompts.
    max_prompt_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0, allow_inf_nan=False)  # 0 means greedy
    top_p: float = Field(1.0, gt=0, le=1)
    # A number, "generation_config" (the model's own file: 1.05 for Qwen2.5-VL, as ms-swift
    # takes it when a request leaves it unset), or None (the backend library's default).
    repetition_penalty: Annotated[float, Field(gt=0, allow_inf_nan=False)] | FromModel | None = None
    top_k: Annotated[int, Field(ge=0)] | FromModel | None = None  # sampling only; 0 turns it off
    concurrency: int = operational(8, ge=1)  # calls in flight per server
    timeout_s: float = operational(120.0, gt=0, allow_inf_nan=False)
    max_retries: int = operational(5, ge=0)
    batch_size: int = operational(8, ge=1)  # transformers: prompts per forward pass
    device: str = "auto"  # transformers: "cpu", "cuda", "auto"
    max_pixels: int = Field(448 * 448, ge=1)  # images are resized to this budget before they are sent
    image_encoding: Literal["jpeg-bilinear", "png-nearest"] = "jpeg-bilinear"
    seed: int = 0
    # vllm: extra vllm.LLM arguments (tensor_parallel_size, gpu_memory_utilization, max_model_len)
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # world: the stand-in perceiver's error rates (``demo.world_perceiver.WorldErrors``).
    world: dict[str, float] = Field(default_factory=dict)

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str) -> str:
        if kind not in BY_NAME:
            raise ValueError(f"{kind!r} is no backend kind: use one of {', '.join(BY_NAME)}")
        return kind

    @property
    def served(self) -> bool:
        return BY_NAME[self.kind].served

    @property
    def in_process(self) -> bool:
        """A model loaded in this process: neither served nor the demo's stand-in."""
        return not (self.served or self.stand_in)

    @property
    def needs_key(self) -> bool:
        return BY_NAME[self.kind].needs_key

    @property
    def stand_in(self) -> bool:
        return BY_NAME[self.kind].stand_in

    @model_validator(mode="after")
    def _known_secret(self) -> "BackendConfig":
        # Every process that reads a recipe redacts the key, even where the backend runs elsewhere.
        register_secret_env(self.api_key_env)
        return self

    @model_validator(mode="after")
    def _one_way_to_name_servers(self) -> "BackendConfig":
        if self.base_url is not None and self.base_urls is not None:
            raise ValueError(f"backend: set `base_url` or `base_urls`, not both (base_url {self.base_url!r}, "
                             f"base_urls {self.base_urls!r}); put every server in `base_urls`")
        if self.base_urls is not None:
            urls = [u.rstrip("/") for u in self.base_urls]
            if twice := sorted({u for u in urls if urls.count(u) > 1}):
                raise ValueError(f"backend: `base_urls` names {', '.join(twice)} more than once; list each server once")
        return self

    def urls(self) -> list[str]:
        if self.base_urls is not None:
            return list(self.base_urls)
        return [self.base_url] if self.base_url else []

    def pin(self, index: int | None) -> "BackendConfig":
        """This config with server ``index % len(urls())`` alone, so N shards run on their own
        spread over N servers (``index`` None: every server). Only operational fields change."""
        urls = self.urls()
        if index is None or not urls:
            return self
        return self.model_copy(update={"base_url": urls[index % len(urls)], "base_urls": None})

    def servers_text(self) -> str:
        return ", ".join(self.urls()) or "the default OpenAI endpoint"

    def unready(self, needs_model: bool = True) -> str | None:
        """What this backend lacks to start in this environment, or None; checked before a run."""
        if not self.served:
            return None
        if not self.urls() and not (self.needs_key and os.environ.get(self.api_key_env)):
            return (f"backend {self.kind!r} needs `base_url` (e.g. http://127.0.0.1:8000/v1), `base_urls` or the API "
                    f"key in the environment variable {self.api_key_env}")
        if needs_model and not self.model:
            return f"backend {self.kind!r} needs `model`: the name the server serves the model under"
        return None


@dataclass
class Generation:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None  # set when the call failed after its retries; text is then ""
    # "infra" (the service is down, refuses the key, times out) stops a stage; "item" (this
    # input is bad) is recorded and the stage goes on.
    error_kind: Literal["infra", "item"] | None = None
    truncated: bool = False  # a reply over the token budget (a server that ignores it), cut to it
    prompt_truncated: bool = False

    @property
    def infra_failed(self) -> bool:
        return self.error is not None and self.error_kind == "infra"


class Backend(Protocol):
    def generate(self, conversations: list[Conversation], *, schemas: list[dict[str, Any] | None] | None = None,
                 max_new_tokens: int | None = None, on_result: Callable[[int, Generation], None] | None = None
                 ) -> list[Generation]:
        """One generation per conversation, in order; a failed item comes back with ``error``
        set, never raised. ``schemas``: a reply JSON schema per conversation (transformers
        ignores them); ``on_result(index, generation)`` fires once per item as it finishes
        (from another thread for openai)."""

    def close(self) -> None: ...


def map_image_parts(conversation: Conversation, image_part: Callable[[str], dict[str, Any]]) -> Conversation:
    """A copy with each image part replaced by ``image_part(path)``, in its place."""
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


def completion_text(completion: object) -> str:
    """The text of a completion given as a string or as chat messages (TRL's two forms)."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    parts: list[str] = []
    for message in completion:  # type: ignore[union-attr]
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "".join(parts)


def decoding(cfg: BackendConfig, generation_config: Any) -> dict[str, Any]:
    """``repetition_penalty`` and ``top_k`` as the model will run them, "generation_config" read
    from the model's (an object or a dict); left out where unset."""
    out: dict[str, Any] = {}
    for name in ("repetition_penalty", "top_k"):
        value = getattr(cfg, name)
        if value == GENERATION_CONFIG:
            value = (generation_config.get(name) if isinstance(generation_config, dict)
                     else getattr(generation_config, name, None))
        if value is not None:
            out[name] = value
    return out
