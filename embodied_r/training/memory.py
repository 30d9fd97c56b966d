"""GPU memory of a recipe's GRPO training, estimated per GPU from the policy's shape.

What one training process holds, in the order it is allocated:

- the policy's weights: fp32 (4 bytes a parameter) under a plain AdamW, 16-bit beside an fp32
  master copy (``TrainerEnvironment.bf16_weights``), sharded over the processes by ZeRO-3;
- the KL reference: TRL keeps a second full copy of the policy whenever ``beta`` > 0
  (with LoRA the base with its adapters off serves, so no copy);
- the gradients and the optimizer: fp32 gradients and Adam's two fp32 moments for every
  trained parameter (DeepSpeed adds its fp32 master weights), sharded by ZeRO-3;
- generation (transformers' ``generate``): the KV cache of every completion a process
  generates at once (its share of a step, prompt plus completion long) and one layer's
  activations over the prompts at prefill; with vLLM colocated, vLLM's share of the card;
- the update, one micro-batch at a time: with gradient checkpointing one saved input per
  layer and one layer's activations recomputed; the logits of the completion tokens (the
  vocabulary is 152k wide: often the largest single term; TRL's fused log-probability
  kernel keeps no second copy);
- an in-process consistency reference (``training.reference`` of kind transformers on a
  GPU), in its 16-bit inference dtype, in the stages that weight consistency.

Generation and update do not overlap: the peak is the larger of the two beside what stays.
These are estimates (the allocator's fragmentation, CUDA's context and kernels' workspaces
come on top), set against one measurement: a Qwen2.5-0.5B-shaped policy at the ``paper``
recipe's settings, 950-token prompts and 512-token completions, peaked at 11.7 GiB on an
H200 (torch 2.11, TRL 1.16), and this estimate says 11.8 GiB. ``embodied-r check gpu``
measures the peak of one real step of a recipe's own policy to set beside it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from embodied_r.scoring.reward_table import REWARDS
from embodied_r.training.config import TrainingConfig
from embodied_r.training.environment import resolve_config_file, zero_stage

GIB = 1024 ** 3


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape (Qwen2 layout: biased q/k/v, gated MLP); ``vision_parameters``: a VL
    model's vision tower, which the policy drops (``training.policy``) and an in-process
    reference loads."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool = True
    vision_parameters: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def parameters(self) -> int:
        """The language model's parameters."""
        h, kv = self.hidden_size, self.kv_width
        attention = h * h + h + 2 * (h * kv + kv) + h * h
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + h

    def config_kwargs(self) -> dict[str, Any]:
        """``Qwen2Config`` keywords for a random-weight model of this shape."""
        data = asdict(self)
        data.pop("vision_parameters")
        return data


# The shapes of the policies the shipped recipes name, for when neither their weights nor
# their config are on this machine (from each model's published config.json).
KNOWN_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-VL-3B-Instruct": ModelShape(151936, 2048, 36, 16, 2, 11008, True, vision_parameters=668_000_000),
    "Qwen/Qwen2.5-0.5B-Instruct": ModelShape(151936, 896, 24, 14, 2, 4864, True),
}


def shape_from_config(data: dict[str, Any]) -> ModelShape:
    """The language model's shape from a ``config.json`` (a VL one's ``text_config`` first)."""
    text = {**data, **(data.get("text_config") or {})}
    names = [f for f in ModelShape.__dataclass_fields__ if f != "vision_parameters"]
    missing = [n for n in names if n != "tie_word_embeddings" and text.get(n) is None]
    if missing:
        raise ValueError(f"config lacks {', '.join(missing)}: not a decoder this estimate knows")
    values = {n: text[n] for n in names if text.get(n) is not None}
    values["tie_word_embeddings"] = bool(data.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    return ModelShape(**values)


def shape_of(model: str) -> ModelShape | None:
    """The shape of a model reference: its local ``config.json``, else the hub cache's (never
    downloaded), else ``KNOWN_SHAPES``; None when none of them has it."""
    folder = Path(model).expanduser()
    config = folder / "config.json" if folder.is_dir() else None
    if config is None:
        try:
            from huggingface_hub import hf_hub_download

            config = Path(hf_hub_download(model, "config.json", local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached here
            config = None
    if config is not None and config.is_file():
        shape = shape_from_config(json.loads(config.read_text()))
        known = KNOWN_SHAPES.get(model)
        return shape if known is None else ModelShape(**{**asdict(shape), "vision_parameters": known.vision_parameters})
    return KNOWN_SHAPES.get(model)


@dataclass
class MemoryEstimate:
    """Bytes per GPU of each part, the phase peaks, and what the figures assume."""

    parts: dict[str, float]
    generation_peak: float
    update_peak: float
    assumptions: list[str] = field(default_factory=list)
    card_share: float = 0.0  # of the card's memory, reserved by a colocated vLLM

    @property
    def peak(self) -> float:
        return max(self.generation_peak, self.update_peak)

    def gib(self) -> dict[str, float]:
        out = {name: round(value / GIB, 1) for name, value in self.parts.items()}
        out.update(generation_peak=round(self.generation_peak / GIB, 1), update_peak=round(self.update_peak / GIB, 1),
                   peak=round(self.peak / GIB, 1))
        return out


def processes(training: TrainingConfig, gpus: int | None = None) -> int:
    """Training processes of the recipe's launch: its accelerate config's, else ``gpus``
    (DDP on every GPU), else 1."""
    return training.accelerate_processes() or gpus or 1


def estimate(training: TrainingConfig, shape: ModelShape, prompt_tokens: int | None = None,
             completion_tokens: int | None = None, gpus: int | None = None) -> MemoryEstimate:
    """Per-GPU memory of one GRPO step of ``training`` with a policy of ``shape``, prompts of
    ``prompt_tokens`` (default the recipe's ``max_prompt_length``) and completions of
    ``completion_tokens`` (default ``max_completion_length``)."""
    world = processes(training, gpus)
    zero3 = bool(training.accelerate_config) and zero_stage(resolve_config_file(training.accelerate_config)) == 3
    deepspeed = training.deepspeed()
    mixed = training.bf16 is not False  # on a GPU bf16 (or fp16) mixed precision unless turned off
    weights16 = training.bf16_weights(mixed)
    shard = world if zero3 else 1
    params = shape.parameters()
    wbytes = 2 if weights16 else 4
    prompt = prompt_tokens or training.max_prompt_length or 1024
    completion = completion_tokens or training.max_completion_length
    notes = [f"{world} training process(es){', ZeRO-3 sharded' if zero3 else ''}",
             f"{'16-bit' if weights16 else 'fp32'} weights, {'bf16 mixed precision' if mixed else 'fp32 compute'}",
             f"prompts of {prompt} and completions of {completion} tokens"]

    parts: dict[str, float] = {"policy": params * wbytes / shard}
    if training.lora is not None:
        from embodied_r.training.disk import lora_parameters

        trained = lora_parameters(_linear_shapes(shape), training.lora.r, training.lora.target_modules)
        parts["policy"] += trained * 4  # peft keeps the adapters in fp32
    else:
        trained = params
    parts["reference"] = params * wbytes / shard if training.beta > 0 and training.lora is None else 0.0
    parts["gradients"] = trained * 4 / shard
    parts["optimizer"] = trained * (8 + (4 if deepspeed and training.lora is None else 0)) / shard
    if zero3:
        # ZeRO-3 gathers a layer's (and the embeddings') full weights while it computes.
        parts["gathered"] = 2 * (params / shape.num_hidden_layers + shape.vocab_size * shape.hidden_size)

    act = 2 if mixed else 4  # bytes of an activation under autocast
    h, inter, kv = shape.hidden_size, shape.intermediate_size, shape.kv_width
    batch = training.per_device_train_batch_size
    tokens = batch * (prompt + completion)
    layer = tokens * (4 * h + 2 * kv + 4 * inter) * act  # one layer's activations, recomputed in backward
    if training.gradient_checkpointing:
        # Saved layer inputs: the residual stream, in the weights' dtype.
        saved = shape.num_hidden_layers * tokens * h * wbytes + layer
    else:
        saved = shape.num_hidden_layers * (layer + tokens * h * wbytes)
    logits = batch * completion * shape.vocab_size * act  # the completion tokens' logits
    parts["activations"] = saved + logits

    generating = batch * training.accumulation_steps(world)  # completions a process generates at once
    share = 0.0
    if training.vllm is not None and training.vllm.mode == "colocate":
        share = training.vllm.gpu_memory_utilization
        parts["generation"] = 0.0
        notes.append(f"vLLM colocated: {share:.0%} of the card on top")
    else:
        cache = 2 * shape.num_hidden_layers * kv * generating * (prompt + completion) * act
        prefill = generating * prompt * (2 * inter + 4 * h) * act
        parts["generation"] = cache + prefill
        notes.append(f"transformers generation of {generating} completions at once")
    consistency = consistency_reference(training)
    if consistency:
        parts["consistency_reference"] = consistency
        notes.append("the in-process consistency reference in the stages that weight consistency")
    stays = (parts["policy"] + parts["reference"] + parts["optimizer"] + parts.get("gathered", 0.0)
             + parts.get("consistency_reference", 0.0))
    return MemoryEstimate(parts=parts, generation_peak=stays + parts["generation"],
                          update_peak=stays + parts["gradients"] + parts["activations"],
                          assumptions=notes, card_share=share)


def consistency_reference(training: TrainingConfig) -> float:
    """Bytes of an in-process consistency reference on a GPU (16-bit, vision tower included),
    when a stage weighs a reward that asks it and the reference's shape is known; else 0."""
    reference = training.reference
    if (reference.kind != "transformers" or reference.device == "cpu" or not reference.model
            or not any(REWARDS[n].asks_reference for s in training.stages for n in s.scored())):
        return 0.0
    shape = shape_of(reference.model)
    return 0.0 if shape is None else 2.0 * (shape.parameters() + shape.vision_parameters)


def _linear_shapes(shape: ModelShape) -> dict[str, list[int]]:
    """Weight shapes of one model of ``shape`` by module name, for ``lora_parameters``."""
    h, kv, inter = shape.hidden_size, shape.kv_width, shape.intermediate_size
    per_layer = {"self_attn.q_proj": [h, h], "self_attn.k_proj": [kv, h], "self_attn.v_proj": [kv, h],
                 "self_attn.o_proj": [h, h], "mlp.gate_proj": [inter, h], "mlp.up_proj": [inter, h],
                 "mlp.down_proj": [h, inter]}
    shapes = {f"model.layers.{i}.{name}.weight": dims for i in range(shape.num_hidden_layers)
              for name, dims in per_layer.items()}
    shapes["model.embed_tokens.weight"] = [shape.vocab_size, h]
    return shapes


PARTS = ("policy", "reference", "gradients", "optimizer", "activations", "generation", "consistency_reference",
         "gathered")


def describe(est: MemoryEstimate) -> str:
    """One line: the peak, and its parts, in GiB."""
    g = est.gib()
    parts = ", ".join(f"{name} {g[name]:.1f}" for name in PARTS if g.get(name))
    extra = f" + {est.card_share:.0%} of the card (vLLM)" if est.card_share else ""
    return f"about {g['peak']:.1f} GiB per GPU{extra} ({parts})"
