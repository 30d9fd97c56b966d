"""GPU memory of a recipe's GRPO training, estimated per GPU from the policy's shape: each part
one training process holds, three phases that do not overlap (generation, the update, the
optimizer step) and the peak, against a card. docs/memory.md sets out every term with the
library behaviour it follows and the measurement the estimate is set against."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from embodied_r.scoring.reward_table import REWARDS
from embodied_r.training.config import TrainingConfig
from embodied_r.training.environment import resolve_config_file, zero_stage
from embodied_r.training.shapes import ModelShape, shape_of

GIB = 1024 ** 3


@dataclass
class MemoryEstimate:
    parts: dict[str, float]
    generation_peak: float
    update_peak: float
    step_peak: float = 0.0
    assumptions: list[str] = field(default_factory=list)
    card_share: float = 0.0  # of the card's memory, reserved by a colocated vLLM
    vllm_needs: float = 0.0  # bytes the colocated vLLM's share must hold
    phases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the parts each phase holds

    @property
    def peak(self) -> float:
        return max(self.generation_peak, self.update_peak, self.step_peak)

    def gib(self) -> dict[str, float]:
        out = {name: round(value / GIB, 1) for name, value in self.parts.items()}
        out.update(generation_peak=round(self.generation_peak / GIB, 1), update_peak=round(self.update_peak / GIB, 1),
                   step_peak=round(self.step_peak / GIB, 1), peak=round(self.peak / GIB, 1),
                   vllm_needs=round(self.vllm_needs / GIB, 1))
        return out

    def on_card(self, card_gib: float) -> float:
        return self.peak + CUDA_OVERHEAD + self.card_share * card_gib * GIB

    def largest(self, count: int = 3) -> list[tuple[str, float]]:
        phase = max(("generation", self.generation_peak), ("update", self.update_peak), ("step", self.step_peak),
                    key=lambda item: item[1])[0]
        names = self.phases.get(phase) or tuple(n for n in self.parts if n != "vllm")
        ranked = sorted(((n, self.parts[n]) for n in names if self.parts.get(n)), key=lambda item: -item[1])
        return ranked[:count]


# CUDA's context, cuBLAS's workspace and the caching allocator's slack, beside what the terms
# count: about what separates torch.cuda.max_memory_allocated from the driver's figure.
CUDA_OVERHEAD = 1.0 * GIB
# A colocated vLLM beyond its weights, KV cache and profiled activations: its CUDA graphs
# (captured after the profile) and its own CUDA context.
VLLM_MARGIN = 1.5 * GIB
# What TRL 1.16 passes to vLLM's LLM in colocate mode (trl/generation/vllm_generation.py).
VLLM_BATCHED_TOKENS = 4096
# TRL 1.16's fused LM head tile (trl/kernels/chunked_logprob.py: TOKEN_CHUNK_SIZE, and
# trl/trainer/utils.py: _CHUNKED_LOGPROB_CHUNK_SIZE).
HEAD_TILE_TOKENS, HEAD_TILE_VOCAB = 4096, 32768
# DeepSpeed's default stage-3 sub_group_size (deepspeed/runtime/zero/config.py).
ZERO3_SUB_GROUP = 1_000_000_000


def processes(training: TrainingConfig, gpus: int | None = None) -> int:
    return training.accelerate_processes() or gpus or 1


def estimate(training: TrainingConfig, shape: ModelShape, prompt_tokens: int | None = None,
             completion_tokens: int | None = None, gpus: int | None = None) -> MemoryEstimate:
    """Per-GPU bytes of one GRPO step (docs/memory.md); the lengths default to the recipe's limits."""
    world = processes(training, gpus)
    zero3 = bool(training.accelerate_config) and zero_stage(resolve_config_file(training.accelerate_config)) == 3
    deepspeed = training.deepspeed()
    ddp = world > 1 and not deepspeed
    mixed = training.bf16 is not False  # on a GPU bf16 (or fp16) mixed precision unless turned off
    weights16 = training.bf16_weights(mixed)
    shard = world if zero3 else 1
    wbytes = 2 if weights16 else 4
    prompt = prompt_tokens or training.max_prompt_length or 1024
    completion = completion_tokens or training.max_completion_length
    views = ddp and training.ddp_gradient_as_bucket_view
    notes = [f"{world} training process(es){', ZeRO-3 sharded' if zero3 else ', DDP' if ddp else ''}",
             f"{'16-bit' if weights16 else 'fp32'} weights, {'bf16 mixed precision' if mixed else 'fp32 compute'}",
             f"prompts of {prompt} and completions of {completion} tokens"]
    if ddp:
        notes.append(f"gradient_as_bucket_view {'on: gradients are views into the buckets' if views else 'off'}")
    parts, trained = _model_state(training, shape, shard, wbytes, deepspeed, ddp, views, zero3, mixed, weights16)
    act = 2 if mixed else 4  # bytes of an activation under autocast
    saved, recomputed = _activations(training, shape, prompt, completion, wbytes, act)
    parts["activations"] = saved + recomputed
    head_forward, head_backward = _lm_head(training, shape, completion, wbytes, act)
    parts["lm_head"] = max(head_forward, head_backward)
    share, vllm_needs = _generation(training, shape, world, prompt, completion, act, parts, notes)
    consistency = consistency_reference(training)
    if consistency:
        parts["consistency_reference"] = consistency
        notes.append("the in-process consistency reference in the stages that weight consistency")
    stays = (parts["policy"] + parts["reference"] + parts["optimizer"] + parts["ddp_buckets"]
             + parts.get("gathered", 0.0) + parts.get("consistency_reference", 0.0))
    if deepspeed:
        stays += parts["gradients"]  # ZeRO's flat gradient buffer lives from the start
        update_grads = 0.0
    else:
        update_grads = parts["gradients"]  # zero_grad(set_to_none) frees them before each rollout
    generation_peak = stays + parts["generation"] + (parts["autocast_copies"] if share == 0 else 0.0)
    update_peak = stays + update_grads + saved + max(parts["autocast_copies"] + head_forward,
                                                     recomputed + head_backward)
    step_fp32 = min(trained / shard, ZERO3_SUB_GROUP) * 4 if zero3 else 0.0
    if step_fp32:
        parts["step_fp32_gradients"] = step_fp32
    step_peak = stays + update_grads + step_fp32
    held = ("policy", "reference", "optimizer", "ddp_buckets", "gathered", "consistency_reference",
            *(("gradients",) if deepspeed else ()))
    phases = {"generation": (*held, "generation", *(("autocast_copies",) if share == 0 else ())),
              "update": (*held, "gradients", "activations", "autocast_copies", "lm_head"),
              "step": (*held, "gradients", "step_fp32_gradients")}
    return MemoryEstimate(parts=parts, generation_peak=generation_peak, update_peak=update_peak,
                          step_peak=step_peak, assumptions=notes, card_share=share, vllm_needs=vllm_needs,
                          phases=phases)


def _model_state(training: TrainingConfig, shape: ModelShape, shard: int, wbytes: int, deepspeed: bool, ddp: bool,
                 views: bool, zero3: bool, mixed: bool, weights16: bool) -> tuple[dict[str, float], int]:
    # The weights, the KL reference, gradients, DDP's buckets, the optimizer; and the trained parameters.
    params = shape.parameters()
    parts: dict[str, float] = {"policy": params * wbytes / shard}
    if training.lora is not None:
        from embodied_r.training.disk import lora_parameters

        trained = lora_parameters(_linear_shapes(shape), training.lora.r, training.lora.target_modules)
        parts["policy"] += trained * 4  # peft keeps the adapters in fp32
        gbytes = 4
    else:
        trained = params
        gbytes = 2 if deepspeed and mixed else wbytes
    parts["reference"] = params * wbytes / shard if training.beta > 0 and training.lora is None else 0.0
    parts["gradients"] = 0.0 if views else trained * gbytes / shard
    parts["ddp_buckets"] = trained * gbytes if ddp else 0.0
    parts["optimizer"] = trained * (8 + (4 if deepspeed and training.lora is None else 0)) / shard
    if zero3:
        # ZeRO-3 gathers a layer's (and the embeddings') full weights while it computes.
        parts["gathered"] = 2 * (params / shape.num_hidden_layers + shape.vocab_size * shape.hidden_size)
    fp32_trained = training.lora is not None or not weights16
    parts["autocast_copies"] = 2 * trained if mixed and fp32_trained else 0.0
    return parts, trained


def _activations(training: TrainingConfig, shape: ModelShape, prompt: int, completion: int, wbytes: int,
                 act: int) -> tuple[float, float]:
    # (saved through the update, recomputed in the backward) of one micro-batch.
    h, inter, kv = shape.hidden_size, shape.intermediate_size, shape.kv_width
    tokens = training.per_device_train_batch_size * (prompt + completion)
    layer = tokens * (4 * h + 2 * kv + 4 * inter) * act  # one layer's activations, recomputed in backward
    if training.gradient_checkpointing:
        # Saved layer inputs: the residual stream, in the weights' dtype.
        return shape.num_hidden_layers * tokens * h * wbytes, layer
    return shape.num_hidden_layers * (layer + tokens * h * wbytes), 0.0


def _lm_head(training: TrainingConfig, shape: ModelShape, completion: int, wbytes: int, act: int,
             ) -> tuple[float, float]:
    # (forward, backward) of TRL's fused head, which scores the completion tokens only.
    h = shape.hidden_size
    scored = training.per_device_train_batch_size * completion
    tile = min(scored, HEAD_TILE_TOKENS) * min(shape.vocab_size, HEAD_TILE_VOCAB) * act
    head_forward = tile + scored * h * wbytes  # the tile and the scored hidden states it saves
    head_backward = (tile + scored * h * 4  # the tile again, the hidden states' fp32 gradient
                     + (shape.vocab_size * h * 4 if training.lora is None else 0)  # the head's fp32 gradient
                     + (min(shape.vocab_size, HEAD_TILE_VOCAB) * h * act if wbytes != act else 0))  # a cast slice
    return head_forward, head_backward


def _generation(training: TrainingConfig, shape: ModelShape, world: int, prompt: int, completion: int, act: int,
                parts: dict[str, float], notes: list[str]) -> tuple[float, float]:
    # Into ``parts`` and ``notes``; returns (vLLM's share of the card, what that share must hold).
    generating = training.per_device_train_batch_size * training.accumulation_steps(world)  # at once, per process
    if training.vllm is not None and training.vllm.mode == "colocate":
        share = training.vllm.gpu_memory_utilization
        parts["generation"] = 0.0
        vllm_needs = vllm_memory(training, shape, prompt + completion, generating)
        parts["vllm"] = vllm_needs
        notes.append(f"vLLM colocated: {share:.0%} of the card, which must hold {vllm_needs / GIB:.1f} GiB")
        return share, vllm_needs
    kv, inter, h = shape.kv_width, shape.intermediate_size, shape.hidden_size
    cache = 2 * shape.num_hidden_layers * kv * generating * (prompt + completion) * act
    prefill = generating * prompt * (2 * inter + 4 * h) * act
    parts["generation"] = cache + prefill
    notes.append(f"transformers generation of {generating} completions at once")
    return 0.0, 0.0


def vllm_memory(training: TrainingConfig, shape: ModelShape, sequence: int, generating: int) -> float:
    """Bytes a colocated vLLM needs: TRL lets it run ``generating`` x tensor-parallel sequences
    of up to ``max_model_len`` tokens at once."""
    assert training.vllm is not None
    tp = training.vllm.tensor_parallel_size
    length = training.vllm.max_model_length or sequence
    seqs = generating * tp
    kv = 2 * shape.num_hidden_layers * shape.kv_width * 2  # bytes a token of the 16-bit cache
    cache = seqs * length * kv / tp
    weights = 2 * shape.parameters() / tp
    profiled = (VLLM_BATCHED_TOKENS * (2 * shape.intermediate_size + 4 * shape.hidden_size) * 2 / tp
                + seqs * shape.vocab_size * 4)  # the sampler's fp32 logits
    return cache + weights + profiled + VLLM_MARGIN


def vllm_share(est: MemoryEstimate, card_gib: float) -> float:
    """The ``gpu_memory_utilization`` that holds what vLLM needs, rounded up to 0.05."""
    return math.ceil(est.vllm_needs / (card_gib * GIB) / 0.05 - 1e-9) * 0.05


def verdict(est: MemoryEstimate, card_gib: float) -> tuple[bool, str]:
    used = est.on_card(card_gib) / GIB
    largest = ", ".join(f"{name} {value / GIB:.1f}" for name, value in est.largest())
    vllm = f" + vLLM {est.card_share:.0%} ({est.card_share * card_gib:.1f})" if est.card_share else ""
    line = (f"{used:.1f} of {card_gib:.1f} GiB (peak {est.peak / GIB:.1f}{vllm} + CUDA overhead "
            f"{CUDA_OVERHEAD / GIB:.1f}; largest: {largest})")
    if est.card_share and est.card_share * card_gib * GIB < est.vllm_needs:
        return False, (f"does not fit: vLLM's share {est.card_share * card_gib:.1f} GiB is below the "
                       f"{est.vllm_needs / GIB:.1f} GiB it needs (gpu_memory_utilization "
                       f"{vllm_share(est, card_gib):.2f}); {line}")
    if used > card_gib:
        return False, f"does not fit: {line}"
    return True, f"fits: {line}"


# Cards by the memory their driver reports (GiB), smallest first: what a verdict names.
CARDS: tuple[tuple[str, float], ...] = (
    ("24 GB (L4, A10)", 22.5), ("40 GB (A100, A800)", 39.6), ("48 GB (L40S)", 45.0),
    ("80 GB (A100, A800, H100)", 79.6), ("141 GB (H200)", 140.4))


def card_needed(est: MemoryEstimate) -> str | None:
    """The smallest card the estimate fits, vLLM's share taken at what it needs."""
    for name, gib in CARDS:
        fitted = est if not est.card_share else dataclasses.replace(est, card_share=vllm_share(est, gib))
        if verdict(fitted, gib)[0]:
            return name
    return None


def launch_refusal(training: TrainingConfig, shape: ModelShape, world: int, card_gib: float,
                   prompt_tokens: int, name: str = "this recipe") -> str | None:
    est = estimate(training, shape, prompt_tokens, gpus=world)
    fits, why = verdict(est, card_gib)
    if fits:
        return None
    needed = card_needed(est) or "more than any single card listed"
    hint = ""
    if est.parts.get("ddp_buckets") and not training.ddp_gradient_as_bucket_view:
        views = estimate(training.model_copy(update={"ddp_gradient_as_bucket_view": True}), shape, prompt_tokens,
                         gpus=world)
        if verdict(views, card_gib)[0]:
            hint = "; or set training.ddp_gradient_as_bucket_view: true, which fits"
    return (f"{name} on {world} process(es) with {prompt_tokens}-token prompts needs a {needed} card per "
            f"process{hint}: {why}")


def consistency_reference(training: TrainingConfig) -> float:
    """Bytes of an in-process reference on a GPU (16-bit, vision tower included) where a stage
    weighs a reward that asks it."""
    reference = training.reference
    if (not reference.in_process or reference.device == "cpu" or not reference.model
            or not any(REWARDS[n].asks_reference for s in training.stages for n in s.scored())):
        return 0.0
    shape = shape_of(reference.model)
    return 0.0 if shape is None else 2.0 * (shape.parameters() + shape.vision_parameters)


def _linear_shapes(shape: ModelShape) -> dict[str, list[int]]:
    h, kv, inter = shape.hidden_size, shape.kv_width, shape.intermediate_size
    per_layer = {"self_attn.q_proj": [h, h], "self_attn.k_proj": [kv, h], "self_attn.v_proj": [kv, h],
                 "self_attn.o_proj": [h, h], "mlp.gate_proj": [inter, h], "mlp.up_proj": [inter, h],
                 "mlp.down_proj": [h, inter]}
    shapes = {f"model.layers.{i}.{name}.weight": dims for i in range(shape.num_hidden_layers)
              for name, dims in per_layer.items()}
    shapes["model.embed_tokens.weight"] = [shape.vocab_size, h]
    return shapes


PARTS = ("policy", "reference", "gradients", "ddp_buckets", "optimizer", "autocast_copies", "activations", "lm_head",
         "generation", "vllm", "consistency_reference", "gathered", "step_fp32_gradients")


def describe(est: MemoryEstimate) -> str:
    g = est.gib()
    parts = ", ".join(f"{name} {g[name]:.1f}" for name in PARTS if g.get(name))
    extra = f" + {est.card_share:.0%} of the card (vLLM)" if est.card_share else ""
    return f"about {g['peak']:.1f} GiB per GPU{extra} ({parts})"
