"""The trainer process of one GRPO stage (``python -m embodied_r.training.grpo SPEC``): TRL's
``GRPOTrainer`` on the stage's records, resumed from the work folder's last checkpoint, saving
``work/model`` and ``work/train_result.json`` for the parent."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

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
from embodied_r.training.child import child_main, common_args, peft_config, run_counts, save_trained_model
from embodied_r.training.config import GRPOStageConfig, TrainingConfig
from embodied_r.training.learning import HISTORY_FILE, quarter_stats, result_figures, schedule_figures
from embodied_r.training.records import conversation  # the prompt the convert stage measured
from embodied_r.training.timing import PhaseTimer, peak_gpu_memory
from embodied_r.training.trl_args import build_config
from embodied_r.training.environment import RESULT_NAME, progress_callback

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
    """``<split>.parquet`` as a conversational dataset. Past ``max_prompt_length`` every prompt
    becomes chat-templated text, the long ones cut from the left; a warning where a cut takes
    a question's options."""
    from datasets import Dataset

    data = [{"prompt": conversation(r), **{c: r[c] for c in REWARD_COLUMNS}} for r in read_records(records, split)]
    if max_prompt_length is not None and model is not None:
        from embodied_r.backends.truncation import limit_prompts

        cut = limit_prompts(data, model, max_prompt_length,
                            parts={"question": lambda r: [r["question"]], "options": lambda r: r["options"] or []})
        if cut.cut:
            (log.warning if cut.lost.get("options") else log.info)("%s", cut.describe())
    return Dataset.from_list(data)


def reward_setup(stage: GRPOStageConfig, cfg: TrainingConfig) -> tuple[list[Any], list[float]]:
    """TRL's ``reward_funcs`` and ``reward_weights`` of a stage."""
    # An HTTP reference's concurrency is shared by all trainer processes.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    run = cfg.model_copy(update={"reference": reference_for_rank(cfg.reference, world)})
    scored = stage.scored()
    return [REWARDS[name].make(run) for name in scored], list(scored.values())


def stage_seed(cfg: TrainingConfig, stage_index: int) -> int:
    return cfg.seed + (stage_index - 1 if cfg.stage_seeds == "offset" else 0)


def grpo_kwargs(stage: GRPOStageConfig, cfg: TrainingConfig, work: Path, weights: list[float],
                report_to: list[str], world: int = 1) -> dict[str, Any]:
    """A stage's GRPOConfig arguments for ``world`` processes; the batch shape is checked again
    here, where the process count is always known."""
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


def memory_refusal(cfg: TrainingConfig, model: str, dataset: Any, world: int, card_gib: float | None,
                   name: str = "this recipe") -> str | None:
    """One line refusing the launch when the estimate at the longest prompt the loss sees does
    not fit ``card_gib`` (None: no GPU)."""
    from embodied_r.training.memory import launch_refusal
    from embodied_r.training.shapes import shape_of
    from embodied_r.training.policy import load_tokenizer, prompt_ids

    shape = shape_of(model)
    if card_gib is None or shape is None or len(dataset) == 0:
        return None
    tok = load_tokenizer(model)
    longest = max(len(prompt_ids(tok, prompt)) for prompt in dataset["prompt"])
    return launch_refusal(cfg, shape, world, card_gib, longest, name)


def grpo_args(stage: GRPOStageConfig, cfg: TrainingConfig, work: Path, weights: list[float],
              report_to: list[str], world: int = 1) -> Any:
    from trl import GRPOConfig

    return build_config(GRPOConfig, grpo_kwargs(stage, cfg, work, weights, report_to, world))


def _card_gib(cfg: TrainingConfig) -> float | None:
    if cfg.use_cpu:
        return None
    import torch

    return torch.cuda.get_device_properties(0).total_memory / 1024 ** 3 if torch.cuda.is_available() else None


def _datasets(spec: dict[str, Any], cfg: TrainingConfig, world: int) -> tuple[Any, Any]:
    # prompt_cut both: the dataset's prompts are cut; rollout_only: only generation's.
    cut_here = cfg.max_prompt_length if cfg.prompt_cut == "both" else None
    dataset = load_dataset(Path(spec["records"]), cut_here, spec["init_model"])
    evaluation = (load_dataset(Path(spec["records"]), cut_here, spec["init_model"], split="val")
                  if cfg.eval_steps is not None else None)
    refusal = memory_refusal(cfg, spec["init_model"], dataset, world, _card_gib(cfg), spec.get("recipe", "this recipe"))
    if refusal:
        # Before any weight is loaded: a run that would stop on CUDA out of memory minutes in.
        raise SystemExit(refusal)
    return dataset, evaluation


def _trainer(spec: dict[str, Any], cfg: TrainingConfig, stage: GRPOStageConfig, dataset: Any, evaluation: Any,
             funcs: list[Any], weights: list[float], world: int, adapter_chain: bool) -> tuple[Any, Any, Any, str]:
    """The trainer, its reporting and chain callbacks, and the model id it was built from."""
    work, chain = Path(spec["work"]), spec.get("chain") or {}
    run_id, uri = os.environ.get("MLFLOW_RUN_ID"), os.environ.get("MLFLOW_TRACKING_URI")
    # TRL's own reporting would log flat names from step 1 and rename the run.
    args = grpo_args(stage, cfg, work, weights, [], world)
    offset = int(spec.get("global_step_offset", 0))
    reporting = reporting_callback(spec.get("run_name", stage.name), int(spec.get("stage_index", 1)), offset,
                                   run_id, uri, cfg.completion_table_rows, cfg.completion_table_steps, work)
    holder: dict[str, Any] = {}
    chained = chain_callback(holder, chain.get("state"))
    cls = trainer_class(cfg.max_prompt_length if cfg.prompt_cut == "rollout_only" else None,
                        chain.get("schedule_steps"), offset if chain.get("state") else 0,
                        bucket_view=cfg.ddp_gradient_as_bucket_view)
    # TRL builds the KL reference from the policy's model id. Full training starts from the previous
    # stage's model, as ms-swift 3.3's resume loads both; LoRA from the chain's initial weights with
    # the previous adapter loaded, so the reference (adapters off) is the base, as in ms-swift.
    model = chain["initial_model"] if adapter_chain else spec["init_model"]
    if cfg.vllm is not None and cfg.vllm.dtype is not None:
        from embodied_r.training.vllm_colocate import engine_dtype

        engine_dtype(cfg.vllm.dtype)
    trainer = cls(model=model, reward_funcs=funcs, args=args, train_dataset=dataset, eval_dataset=evaluation,
                  peft_config=peft_config(cfg.lora), callbacks=[progress_callback(), reporting, chained])
    holder["trainer"] = trainer
    drop_raw_log_printers(trainer)
    reporting.trainer = trainer
    return trainer, reporting, chained, model


def _train(trainer: Any, cfg: TrainingConfig, stage: GRPOStageConfig, work: Path, chain: dict[str, Any],
           adapter_chain: bool) -> tuple[int, float, dict[str, Any]]:
    """Resume or start the stage, train and save; the start step, seconds trained and best-model figures."""
    resume, start_step = last_checkpoint(work)
    if resume:
        log.info("resuming stage %s from %s", stage.name, resume)
    elif adapter_chain:
        load_chain_weights(trainer, chain["state"])
    started = time.monotonic()
    trainer.train(resume_from_checkpoint=resume)
    seconds = time.monotonic() - started
    save_trained_model(trainer, work, lora=cfg.lora is not None)
    return start_step, seconds, keep_best_model(trainer, work) if cfg.keep_best else {}


def _chain_figures(cfg: TrainingConfig, chain: dict[str, Any], init_model: str, model: str, chained: Any,
                   trainer: Any) -> dict[str, Any]:
    return {
        "stage_chain": cfg.stage_chain,
        "chain_initial_model": chain.get("initial_model") or init_model,
        "reference_model": model,  # TRL's KL reference is built from the policy's model id
        "chain_loaded": chained.loaded,
        "first_learning_rate": chained.first_lr,
        "first_adam_step": chained.first_adam_step,
        "last_learning_rate": last_lr(trainer),
        "schedule_steps": chain.get("schedule_steps") or int(trainer.state.max_steps),
    }


def _finish(trainer: Any, cfg: TrainingConfig, work: Path, history: dict[str, Any], result: dict[str, Any]) -> None:
    if trainer.accelerator.is_main_process:
        write_json_atomic(work / HISTORY_FILE, history)
        write_json_atomic(work / RESULT_NAME, result)
    if cfg.vllm is not None and cfg.vllm.mode == "colocate":
        from embodied_r.training.vllm_colocate import shut_down

        shut_down(trainer)


def main(spec_path: str) -> int:
    spec = read_json(Path(spec_path))
    cfg = TrainingConfig.model_validate(spec["training"])
    stage = GRPOStageConfig.model_validate(spec["stage"])
    cfg = cfg.model_copy(update={"seed": stage_seed(cfg, int(spec.get("stage_index", 1)))})
    work = Path(spec["work"])
    chain = spec.get("chain") or {}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dataset, evaluation = _datasets(spec, cfg, world)
    funcs, weights = reward_setup(stage, cfg)
    adapter_chain = bool(chain.get("state")) and cfg.lora is not None
    trainer, reporting, chained, model = _trainer(spec, cfg, stage, dataset, evaluation, funcs, weights, world,
                                                  adapter_chain)
    timer = PhaseTimer(trainer)
    trainer.add_callback(timer.callback())
    sync_check = None
    if cfg.vllm is not None and cfg.vllm.sync_check:
        from embodied_r.training.vllm_colocate import SyncCheck

        sync_check = SyncCheck(trainer, dataset[0]["prompt"], cfg.vllm.sync_tolerance, work)
    start_step, seconds, best = _train(trainer, cfg, stage, work, chain, adapter_chain)
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
        **schedule_figures(trainer.state, stage.epochs, cfg.max_steps_per_stage,
                           int(spec.get("global_step_offset", 0))),
        "reward_funcs": reward_names,
        "reward_weights": weights,
        "lora": cfg.lora is not None,
        "vllm_rollouts": cfg.vllm is not None,
        **(sync_check.summary() if sync_check is not None else {}),
        "processes": int(trainer.accelerator.num_processes),
        "completion_tables": reporting.tables,
        **_chain_figures(cfg, chain, spec["init_model"], model, chained, trainer),
        **best,
        **result_figures(trainer.state.log_history, reward_names),
        # First and last quarter of the steps: did the stage raise the rewards it weights?
        "quarters": quarter_stats(trainer.state.log_history, reward_names),
    }
    _finish(trainer, cfg, work, {"reward_funcs": reward_names, "weights": weights,
                                 "history": trainer.state.log_history}, result)
    return 0


if __name__ == "__main__":
    child_main(main, "embodied_r.training.grpo")
