"""The training stages: GRPO records from the perception text (``records``, the convert
stage), the stage configs (``config``), the trainer process and its launch (``environment``),
the GRPO stage's parent side (``stage``) and child (``grpo``), SFT's parent side and Embodied-R's
examples (``sft``) and the SFT child both pipelines start (``sft_child``); what the parent
settles before a trainer starts: the policy as a causal LM (``policy``) and room for its
checkpoints (``disk``); TRL configs built from the installed library's own names (``trl_args``); the
policy's prompt texts (``prompts``); where a step's time and GPU memory go (``timing``) and
what a recipe needs per GPU (``memory``); the colocated vLLM engine's dtype and the check of its
weight sync (``vllm_colocate``).

May import: the core, ``backends`` and ``scoring``.
"""
