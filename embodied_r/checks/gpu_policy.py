"""The policy step of ``embodied-r check gpu``: GRPO steps of a recipe's own policy at its own
trainer settings in one process on this GPU, timed, its peak memory beside the estimate. Without
the weights here, a random-weight model of the policy's shape stands in: the same memory and time
per token, and every completion runs to full length (no end-of-sequence token), the worst case."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from embodied_r.backends.models import build_atomically, resolve_model
from embodied_r.checks.steps import VIDEO_LINE, Skip, write_records
from embodied_r.config import load_recipe
from embodied_r.paths import home
from embodied_r.training.config import TrainingConfig
from embodied_r.training.memory import describe, estimate
from embodied_r.training.shapes import ModelShape, shape_from_config, shape_of

PROMPT_TOKENS = 950  # the paper's records, perception text included (the demo's run to about 150)


def _local_weights(policy: str) -> str | None:
    """The policy's language-model folder when its weights are on this machine (the hub is
    offline: nothing is downloaded); else None."""
    from embodied_r.training.policy import training_model

    try:
        folder = Path(training_model(policy)).expanduser()
    except Exception:  # noqa: BLE001 - not here: a random-weight stand-in is built
        return None
    return str(folder) if folder.is_dir() and any(folder.glob("*.safetensors")) else None


def random_policy(shape: ModelShape, name: str, device: str) -> str:
    """A Qwen2 causal LM of ``shape`` with random weights and the tiny LM's tokenizer (its ids
    lie inside any vocabulary), built once under the home."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    key = hashlib.sha256(json.dumps(shape.config_kwargs(), sort_keys=True).encode()).hexdigest()[:12]
    tiny = resolve_model("tiny:lm")

    def build(folder: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(tiny)
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        config = Qwen2Config(**shape.config_kwargs(), max_position_embeddings=32768, eos_token_id=eos,
                             pad_token_id=pad, bos_token_id=pad, architectures=["Qwen2ForCausalLM"])
        torch.manual_seed(0)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # half the disk; the trainer loads the dtype it trains in
        try:
            with torch.device("cuda" if device != "cpu" else "cpu"):
                model = Qwen2ForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
        model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
        model.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))
        del model
        if device != "cpu":
            torch.cuda.empty_cache()

    safe = name.replace("/", "--").replace(":", "-")
    return str(build_atomically(home() / "models" / f"random-{safe}-{key}", build))


def prompt_frames(tokenizer_folder: str, target: int) -> tuple[int, int]:
    """(perception lines per record, prompt tokens) for prompts of about ``target`` tokens."""
    from transformers import AutoTokenizer

    from embodied_r.training.records import build_record, conversation
    from embodied_r.training.records_config import RecordsConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    row = {"uid": "x", "benchmark": "urbanvideo", "category": "c", "split": "train", "question": "Which direction?",
           "options": ["A. left", "B. right"], "answer": "A", "answer_type": "choice"}

    def length(frames: int) -> int:
        video = "\n".join(VIDEO_LINE.format(i=i) for i in range(frames))
        ids = tokenizer.apply_chat_template(conversation(build_record(row, video, RecordsConfig())),
                                            tokenize=True, add_generation_prompt=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    base, one = length(1), length(2) - length(1)
    frames = max(1, 1 + round((target - base) / max(one, 1)))
    return frames, length(frames)


def step_config(training: TrainingConfig, policy: str, spec: dict[str, Any]) -> TrainingConfig:
    """The recipe's trainer settings for ``spec['steps']`` steps in one process: a multi-GPU or
    DeepSpeed launch is what this check cannot stand in for."""
    vllm = training.vllm
    if vllm is not None:
        try:
            import vllm as _  # noqa: F401
        except ImportError:
            vllm = None
    data = training.model_dump()
    data.update(policy=policy, launcher="python", accelerate_config=None, python=None,
                use_cpu=spec["device"] == "cpu", max_steps_per_stage=spec.get("steps", 2), eval_steps=None,
                keep_best=False, stage_chain="fresh", completion_table_rows=0, save_total_limit=1,
                save_only_model=True,
                vllm=vllm.model_dump() if vllm is not None else None,
                grpo_args={**training.grpo_args, "save_strategy": "no"})  # measured, not kept
    if spec.get("completion_tokens"):
        data["max_completion_length"] = int(spec["completion_tokens"])
    return TrainingConfig.model_validate(data)


def check_policy(spec: dict[str, Any]) -> dict[str, Any]:
    from embodied_r.training.stage import run_training_stage

    recipe = load_recipe(spec["recipe"])
    training = recipe.training
    work = Path(spec["work"])
    if spec.get("policy_shape") == "tiny":
        # The check itself, checked on a CPU: the tiny LM's shape stands in for the policy's.
        tiny = resolve_model("tiny:lm")
        shape = shape_from_config(json.loads((Path(tiny) / "config.json").read_text()))
        folder, source = random_policy(shape, "tiny-shape", spec["device"]), "the tiny LM's shape, random weights"
    else:
        if spec["device"] == "cpu":
            raise Skip(f"no GPU: a step of {training.policy} on the CPU would take hours")
        folder = _local_weights(training.policy)
        shape = shape_of(folder or training.policy)
        if folder is not None:
            source = f"its weights in {folder}"
        elif shape is None:
            raise Skip(f"neither the weights nor the shape of {training.policy} are on this machine: "
                       "give a local folder as training.policy")
        else:
            folder, source = random_policy(shape, training.policy, spec["device"]), "its shape, random weights"
    cfg = step_config(training, folder, spec)
    frames, prompt_tokens = prompt_frames(folder, int(spec.get("prompt_tokens") or PROMPT_TOKENS))
    prompts_per_step = max(cfg.accumulation_steps(1) * cfg.per_device_train_batch_size // cfg.num_generations, 1)
    records = write_records(work / "records", prompts_per_step * (cfg.max_steps_per_stage or 1), frames)
    stage = training.stages[0]
    summary = run_training_stage(records, folder, work / "policy-step", stage, cfg)
    last = summary.get("last_step") or {}
    est = estimate(cfg, shape, prompt_tokens, cfg.max_completion_length)
    peak = summary.get("peak_gpu_memory_gib")
    settings = (f"{spec['recipe']}: {training.policy} ({source}), {cfg.num_generations} generations, "
                f"{cfg.num_generations * prompts_per_step} completions per step, prompts of {prompt_tokens} tokens, "
                f"completions cut at {cfg.max_completion_length}, "
                f"{'vLLM' if cfg.vllm is not None else 'transformers'} generation")
    timing = (f"{last.get('seconds', 0):.1f} s/step after the first (generation {last.get('seconds_generation', 0):.1f}, "
              f"update {last.get('seconds_update', 0):.1f})" if summary.get("steps", 0) > 1 else
              f"{summary.get('seconds_per_step')} s for its one step")
    memory = (f"peak {peak:.1f} GiB, estimated {est.gib()['peak']:.1f} GiB" if peak is not None
              else f"estimated {describe(est)}")
    problems = [] if summary.get("steps") == cfg.max_steps_per_stage else [
        f"{summary.get('steps')} steps, expected {cfg.max_steps_per_stage}"]
    return {"ok": not problems, "detail": "; ".join(problems + [settings, timing, memory]),
            "figures": {"seconds_per_step_after_first": last.get("seconds"),
                        "seconds_generation": last.get("seconds_generation"),
                        "seconds_update": last.get("seconds_update"), "peak_gpu_memory_gib": peak,
                        "estimated_gib": est.gib(), "prompt_tokens": prompt_tokens,
                        "completion_tokens": cfg.max_completion_length, "first_step": summary.get("first_step")}}
