"""The backend registry: each ``kind`` a config may name, the class that runs it and what it
is. Read when recipes validate, so it imports nothing."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BackendKind:
    target: str  # "module:Class", imported when a config names the kind (``factory``)
    served: bool = False  # over HTTP, by a server that holds the model; else in this process
    needs_key: bool = False  # sends the key in ``api_key_env``
    stand_in: bool = False  # not a model: the demo's perceiver, which reads the videos' records


# By module name: a stage's key hashes a kind's module only where its config names it, and
# the method's packages import nothing of the demo's.
BY_NAME = {
    "transformers": BackendKind("embodied_r.backends.hf_local:TransformersBackend"),
    "openai": BackendKind("embodied_r.backends.openai_compat:OpenAIBackend", served=True, needs_key=True),
    "vllm": BackendKind("embodied_r.backends.vllm_engine:VLLMBackend"),
    "world": BackendKind("embodied_r.demo.world_perceiver:WorldPerceiver", stand_in=True),
}
