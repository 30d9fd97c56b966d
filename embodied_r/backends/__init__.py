"""Model access shared by perception, the consistency reward and evaluation.

``base`` is the protocol (config, conversation, generation, the ``Backend`` interface) and
is all a concrete backend imports; ``factory.make_backend`` picks one: ``hf_local``
(transformers in process), ``openai_compat`` (any OpenAI-compatible HTTP endpoint) or
``vllm_engine`` (vLLM in process). ``images`` scales and encodes images for all three;
``models`` resolves model references to local folders (the demo's ``tiny:<name>`` by the
demo's module name, never by importing it) and loads a Qwen2.5-VL processor; ``smol`` fetches
SmolLM2 (``smol:135m``); ``devices`` decides a model's GPU and precision, ``tokens`` checks a
pad token against the chat template; ``cpu_adapters`` holds what vLLM, torchvision and
accelerate need on a CPU, where the GPU recipes are rehearsed (installed by the training
environment's CPU replica only).

May import: the core (``paths``) only.
"""
