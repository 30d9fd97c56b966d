"""Model access shared by perception, the consistency reward and evaluation.

``base`` is the protocol (config, conversation, generation, the ``Backend`` interface) and
is all a concrete backend imports; ``factory.make_backend`` picks one: ``hf_local``
(transformers in process), ``openai_compat`` (any OpenAI-compatible HTTP endpoint) or
``vllm_engine`` (vLLM in process). ``images`` scales and encodes images for all three;
``tiny_models`` builds the small local models the demo and the tests run on.

May import: the core (``paths``) only.
"""
