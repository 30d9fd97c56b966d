"""The trainer process of one GRPO stage: ``python -m embodied_r.training.grpo SPEC``.

SPEC is the JSON written by ``training.run_training_stage``. This process builds TRL's
``GRPOTrainer`` on the stage's records, resumes from the last checkpoint in the stage's
work folder if there is one, saves the final model and tokenizer to ``work/model`` and
writes ``work/train_result.json`` for the parent. Its helpers (dataset, LoRA, saving,
the completions table, timing) serve the SFT trainer process too.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import pyarrow.parquet as pq

from embodied_r.backends.devices import Precision, training_precision
from embodied_r.io import read_json, write_json_atomic
from embodied_r.scoring.reward_table import REWARDS
from embodied_r.scoring.rewards import reference_for_rank
from embodied_r.training.callbacks import drop_raw_log_printers, reporting_callback
from embodied_r.training.chain import (
    BEST_METRIC,
    chain_callback,
    keep_best_model,
    last_lr,
    load_chain_weights,
    trainer_class,
)
from embodied_r.training.checkpoints import last_checkpoint
from embodied_r.training.config import GRPOStageConfig, TrainingConfig
from embodied_r.training.learning import HISTORY_FILE, quarter_stats, result_figures, schedule_figures
from embodied_r.training.records import conversation  # the prompt the convert stage measured
from embodied_r.training.timing import PhaseTimer, peak_gpu_memory
from embodied_r.training.trl_args import build_config, field_name
from embodied_r.training.environment import (
    progress_callback,
    ADAPTER,
    CHECKPOINTS,
    RESULT_NAME,
    LoraSettings,
    TrainerEnvironment,
)

log = logging.getLogger("embodied_r.training.grpo")

# Columns the reward functions read; TRL hands every non-prompt column to them.
REWARD_COLUMNS = ("uid", "category", "solution", "answer_type", "question", "options")


def read_records(records: Path, split: str = "train") -> list[dict[str, Any]]:
    path = Path(records) / f"{split}.parquet"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (run the convert stage first)")
    rows = pq.read_table(path).to_pylist()
    if not rows:
        what = "nothing to train on" if split == "train" else "nothing to validate on: set training.eval_steps: null"
        raise ValueError(f"{path} holds no records; {what}")
    return rows


def load_dataset(records: Path, max_prompt_length: int | None = None, model: str | None = None,
                 split: str = "train") -> Any:
    """``<split>.parquet`` as a conversational dataset: prompt = system + user turns. With
    ``max_prompt_length`` and any prompt longer, every prompt becomes its chat-templated
    text, the long ones cut from the left (``truncation.limit_prompts``)."""
    from datasets import Dataset

    data = [{"prompt": conversation(r), **{c: r[c] for c in REWARD_COLUMNS}} for r in read_records(records, split)]
    if max_prompt_length is not None and model is not None:
        from embodied_r.backends.truncation import limit_prompts

        truncated = limit_prompts(data, model, max_prompt_length)
        if truncated:
            log.warning("%d of %d prompts are longer than max_prompt_length=%d tokens: their beginning is cut",
                        truncated, len(data), max_prompt_length)
    return Dataset.from_list(data)


def reward_setup(stage: GRPOStageConfig, cfg: TrainingConfig) -> tuple[list[Any], list[float]]:
    """Reward functions and weights of a stage, as TRL's ``reward_funcs`` and ``reward_weights``:
    each reward of positive weight (``GRPOStageConfig.scored``), built from ``REWARDS`` with the
    run's scoring and reference."""
    # An HTTP reference's concurrency is shared by all trainer processes.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    run = cfg.model_copy(update={"reference": reference_for_rank(cfg.reference, world)})
    scored = stage.scored()
    return [REWARDS[name].make(run) for name in scored], list(scored.values())


def stage_seed(cfg: TrainingConfig, stage_index: int) -> int:
    """The trainer seed of the ``stage_index``-th stage (1 for the first): ``training.stage_seeds``."""
    return cfg.seed + (stage_index - 1 if cfg.stage_seeds == "offset" else 0)


def precision(env: TrainerEnvironment) -> Precision:
    """The trainer's precision on this machine, its fallback said once in the log."""
    chosen = training_precision(env.bf16, env.use_cpu)
    if chosen.note:
        log.warning(chosen.note)
    return chosen


def common_args(env: TrainerEnvironment, work: Path, run_name: str, report_to: list[str]) -> dict[str, Any]:
    """Trainer arguments shared by GRPO and SFT."""
    from transformers import TrainingArguments

    chosen = precision(env)
    bf16 = chosen.bf16
    kwargs: dict[str, Any] = {
        "output_dir": str(work / CHECKPOINTS),
        "run_name": run_name,
        "use_cpu": env.use_cpu,
        "bf16": bf16,
        "fp16": chosen.fp16,
        # Named as the installed transformers names it (5.23 renamed it; 5.17 has the old name).
        field_name(TrainingArguments, "gradient_checkpointing"): env.gradient_checkpointing,
        "seed": env.seed,
        "logging_steps": env.logging_steps,
        "save_steps": env.save_steps,
        "save_total_limit": env.save_total_limit,
        "save_only_model": env.save_only_model,
        "report_to": report_to,
        "disable_tqdm": True,  # the parent streams our output into logs; bars only clutter them
    }
    if env.bf16_weights(bf16):
        # bf16 weights where an fp32 master copy lives elsewhere (DeepSpeed, LoRA); else TRL
        # loads fp32 and bf16 is mixed precision (TrainerEnvironment.bf16_weights).
        kwargs["model_init_kwargs"] = {"dtype": "bfloat16"}
    return kwargs


def grpo_kwargs(stage: GRPOStageConfig, cfg: TrainingConfig, work: Path, weights: list[float],
                report_to: list[str], world: int = 1) -> dict[str, Any]:
    """Every keyword argument of a stage's GRPOConfig for a launch of ``world`` processes (a
    pure function: no trainer, no TRL). The batch shape is checked here again, where the
    process count is always known."""
    kwargs = common_args(cfg, work, stage.name, report_to)
    settings = cfg.grpo_settings(world)
    per_step = world * cfg.per_device_train_batch_size * settings["gradient_accumulation_steps"]
    if per_step % cfg.num_generations:
        raise ValueError(f"{world} processes x per_device_train_batch_size {cfg.per_device_train_batch_size} x "
                         f"gradient_accumulation_steps {settings['gradient_accumulation_steps']} = {per_step} "
                         f"completions per step: not whole groups of num_generations = {cfg.num_generations}")
    kwargs.update(settings)
    if cfg.eval_steps is not None:
        # Validation on the val split: TRL generates and scores there as in training.
        kwargs.update({"eval_strategy": "steps", "eval_steps": cfg.eval_steps,
                       # One group per device: any process count then holds whole groups.
                       "per_device_eval_batch_size": cfg.num_generations})
        if cfg.keep_best:
            kwargs.update({"metric_for_best_model": BEST_METRIC, "greater_is_better": True})
    kwargs.update({
        "num_train_epochs": stage.epochs,
        "max_steps": cfg.max_steps_per_stage or -1,
        "reward_weights": weights,
        "log_completions": cfg.log_completions,
    })
    if cfg.vllm is not None:
        kwargs.update(cfg.vllm.grpo_kwargs())
    kwargs.update(cfg.grpo_args)
    return kwargs


def grpo_args(stage: GRPOStageConfig, cfg: TrainingConfig, work: Path, weights: list[float],
              report_to: list[str], world: int = 1) -> Any:
    from trl import GRPOConfig

    return build_config(GRPOConfig, grpo_kwargs(stage, cfg, work, weights, report_to, world))


def peft_config(lora: LoraSettings | None) -> Any:
    if lora is None:
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=lora.target_modules, init_lora_weights=lora.init_lora_weights)


def run_counts(trainer: Any, start_step: int, seconds: float) -> dict[str, Any]:
    """A trainer run's steps and time, counted the same way in every trainer child's result: a
    resumed run's seconds per step are over the steps it ran itself."""
    steps = int(trainer.state.global_step)
    here = max(steps - start_step, 0)
    return {"steps": steps, "steps_this_run": here, "resumed_from_step": start_step, "seconds": round(seconds, 3),
            "seconds_per_step": round(seconds / here, 4) if here else None}


def save_trained_model(trainer: Any, work: Path, lora: bool) -> None:
    """Full weights and tokenizer in ``work/model``, loadable by the next stage and by
    evaluation as they are. With LoRA the adapter goes to ``work/adapter`` and its
    merge with the base weights to ``work/model``."""
    model_dir = work / "model"
    tokenizer = trainer.processing_class
    if not lora:
        trainer.save_model(str(model_dir))  # every process takes part (ZeRO-3 gathers weights)
        if trainer.accelerator.is_main_process and tokenizer is not None:
            tokenizer.save_pretrained(str(model_dir))
        return
    trainer.save_model(str(work / ADAPTER))
    if trainer.accelerator.is_main_process:
        merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
        merged.save_pretrained(str(model_dir))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(model_dir))
    trainer.accelerator.wait_for_everyone()


def quiet_known_warnings() -> None:
    # TRL reads this deprecated property at every generation: one line per step in train.log.
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def main(spec_path: str) -> int:
    spec = read_json(Path(spec_path))
    cfg = TrainingConfig.model_validate(spec["training"])
    stage = GRPOStageConfig.model_validate(spec["stage"])
    cfg = cfg.model_copy(update={"seed": stage_seed(cfg, int(spec.get("stage_index", 1)))})
    work = Path(spec["work"])
    chain = spec.get("chain") or {}
    world = int(os.environ.get("WORLD_SIZE", "1"))

    # prompt_cut both: the dataset's prompts are cut; rollout_only: only generation's.
    cut_here = cfg.max_prompt_length if cfg.prompt_cut == "both" else None
    dataset = load_dataset(Path(spec["records"]), cut_here, spec["init_model"])
    evaluation = (load_dataset(Path(spec["records"]), cut_here, spec["init_model"], split="val")
                  if cfg.eval_steps is not None else None)
    funcs, weights = reward_setup(stage, cfg)
    run_id, uri = os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI")
    # Our own reporting callback logs to MLflow (prefixed names, one global step over the
    # stages); TRL's would log flat names from step 1 and rename the run.
    args = grpo_args(stage, cfg, work, weights, [], world)
    offset = int(spec.get("global_step_offset", 0))
    reporting = reporting_callback(spec.get("run_name", stage.name), int(spec.get("stage_index", 1)), offset,
                                   run_id, uri, cfg.completion_table_rows, cfg.completion_table_steps, work)
    holder: dict[str, Any] = {}
    chained = chain_callback(holder, chain.get("state"))
    cls = trainer_class(cfg.max_prompt_length if cfg.prompt_cut == "rollout_only" else None,
                        chain.get("schedule_steps"), offset if chain.get("state") else 0)
    # TRL builds the KL reference from the same model id as the policy. Full training starts
    # from the previous stage's model, as ms-swift 3.3's resume loads both from the checkpoint;
    # LoRA builds on the chain's initial weights and loads the previous adapter, so the
    # reference (adapters off) is the base, as ms-swift's LoRA resume has it.
    adapter_chain = bool(chain.get("state")) and cfg.lora is not None
    model = chain["initial_model"] if adapter_chain else spec["init_model"]
    trainer = cls(model=model, reward_funcs=funcs, args=args, train_dataset=dataset, eval_dataset=evaluation,
                  peft_config=peft_config(cfg.lora), callbacks=[progress_callback(), reporting, chained])
    holder["trainer"] = trainer
    drop_raw_log_printers(trainer)
    reporting.trainer = trainer
    timer = PhaseTimer(trainer)
    trainer.add_callback(timer.callback())

    resume, start_step = last_checkpoint(work)
    if resume:
        log.info("resuming stage %s from %s", stage.name, resume)
    elif adapter_chain:
        load_chain_weights(trainer, chain["state"])
    started = time.monotonic()
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.monotonic() - started
    save_trained_model(trainer, work, lora=cfg.lora is not None)
    best = keep_best_model(trainer, work) if cfg.keep_best else {}
    for func in funcs:
        close = getattr(func, "close", None)
        if close is not None:
            close()

    reward_names = [getattr(f, "__name__", type(f).__name__) for f in funcs]
    result = {
        **run_counts(trainer, start_step, seconds),
        **timer.split(seconds),
        **peak_gpu_memory(),
        "train_records": len(dataset),
        **schedule_figures(trainer.state, stage.epochs, cfg.max_steps_per_stage, offset),
        "reward_funcs": reward_names,
        "reward_weights": weights,
        "lora": cfg.lora is not None,
        "vllm_rollouts": cfg.vllm is not None,
        "processes": int(trainer.accelerator.num_processes),
        "completion_tables": reporting.tables,
        # The stage chain: where the schedule started and left off, and what carried over.
        "stage_chain": cfg.stage_chain,
        "chain_initial_model": chain.get("initial_model") or spec["init_model"],
        "reference_model": model,  # TRL's KL reference is built from the policy's model id
        "chain_loaded": chained.loaded,
        "first_learning_rate": chained.first_lr,
        "first_adam_step": chained.first_adam_step,
        "last_learning_rate": last_lr(trainer),
        "schedule_steps": chain.get("schedule_steps") or int(trainer.state.max_steps),
        **best,
        **result_figures(trainer.state.log_history, reward_names),
        # First and last quarter of the steps: did the stage raise the rewards it weights?
        "quarters": quarter_stats(trainer.state.log_history, reward_names),
    }
    # Only the main process reports; the others of a multi-GPU launch just exit.
    if trainer.accelerator.is_main_process:
        # Per-step figures, for the reward curves of the report.
        write_json_atomic(work / HISTORY_FILE, {"reward_funcs": reward_names, "weights": weights,
                                                "history": trainer.state.log_history})
        write_json_atomic(work / RESULT_NAME, result)
    return 0


def child_main(main: Callable[[str], int], module: str) -> None:
    """The command line of a trainer child: ``python -m MODULE SPEC.json``."""
    if len(sys.argv) != 2:
        print(f"usage: python -m {module} SPEC.json", file=sys.stderr)
        sys.exit(2)
    from embodied_r.faults import PARENT_PID_ENV, die_with_parent

    # A trainer must not outlive the run that started it (kill -9 included).
    die_with_parent(int(os.environ.get(PARENT_PID_ENV) or 0) or None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_known_warnings()
    code = main(sys.argv[1])
    end_process_group()
    sys.exit(code)


def end_process_group() -> None:
    """Tear the launch's process group down while every rank is still alive.

    Left to interpreter shutdown, a rank that finishes first destroys gloo's worker threads
    while they are joinable, and aborts ("terminate called without an active exception",
    SIGABRT) after its work is saved: the launcher then reports the whole stage failed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    child_main(main, "embodied_r.training.grpo")
