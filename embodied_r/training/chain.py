"""What a GRPO stage changes in TRL's trainer: prompts cut for generation only
(``prompt_cut: rollout_only``), the stage chain (``stage_chain: resume``, as the official
maintainer's three runs resumed each other's checkpoints: Adam state, one learning-rate
schedule, and the previous model as policy and KL reference) and the best checkpoint."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from embodied_r.io import read_summary

log = logging.getLogger(__name__)

CHAIN_STATE = "chain_state"  # a stage's last checkpoint, kept for the next stage of a resume chain
BEST_MODEL = "best_model"
# The metric that ranks checkpoints: TRL's validation mean of the accuracy reward.
BEST_METRIC = "eval_rewards/accuracy_reward/mean"


def chain_source(init_model: str) -> tuple[str | None, str]:
    """(the previous stage's chain state or None, the chain's initial model)."""
    path = Path(init_model).expanduser()
    state = path.parent / CHAIN_STATE
    if path.name != "model" or not state.is_dir() or not (path.parent / "summary.json").is_file():
        return None, init_model
    summary = read_summary(path.parent)
    return str(state), str(summary.get("chain_initial_model") or summary.get("init_model") or init_model)


def chain_schedule_steps(steps: list[int]) -> int:
    return max(sum(steps), 1)


def trainer_class(limit: int | None, schedule_steps: int | None, steps_before: int = 0,
                  bucket_view: bool = False) -> type:
    """TRL's GRPOTrainer with generation prompts cut at ``limit`` tokens and the schedule over
    ``schedule_steps``, ``steps_before`` of them taken by earlier stages."""
    from trl import GRPOTrainer

    class StageTrainer(GRPOTrainer):  # type: ignore[misc]
        def _build_accelerator_args(self, **kwargs: Any) -> dict[str, Any]:
            args = super()._build_accelerator_args(**kwargs)
            if bucket_view:
                # transformers (5.17 to 5.24) builds DDP's kwargs without this one; accelerate's
                # default (False) keeps a second copy of every gradient in the buckets.
                from accelerate.utils import DistributedDataParallelKwargs

                for handler in args.get("kwargs_handlers") or []:
                    if isinstance(handler, DistributedDataParallelKwargs):
                        handler.gradient_as_bucket_view = True
            return args

        def _generate_single_turn(self, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
            if limit is not None:
                # The beginning goes, as ms-swift's left truncation cut it.
                prompt_ids = [ids[-limit:] if len(ids) > limit else ids for ids in prompt_ids]
            if (self.use_vllm or getattr(self, "use_transformers_continuous_batching", False)
                    or self.accelerator.device.type != "cpu"):
                return super()._generate_single_turn(prompt_ids, *args, **kwargs)
            import torch

            # On a CPU autograd's bookkeeping costs more than each small op of generate; inference
            # mode skips it with the same arithmetic, so every sampled token is the same.
            with torch.inference_mode():
                return super()._generate_single_turn(prompt_ids, *args, **kwargs)

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            # The chain's length is planned from record counts; should the trainer count more
            # steps, the schedule still ends at the last one (a cosine past its end rises again).
            total = max(schedule_steps, steps_before + num_training_steps) if schedule_steps else num_training_steps
            return super().create_scheduler(total, optimizer)

    return StageTrainer


def load_chain_weights(trainer: Any, state: str) -> None:
    """The previous stage's weights (LoRA: its adapter); DeepSpeed's load in ``chain_callback``."""
    if not trainer.is_deepspeed_enabled:
        trainer._load_from_checkpoint(state)


def chain_callback(trainer_ref: dict[str, Any], state: str | None) -> Any:
    """Loads the previous stage's optimizer and scheduler state at the start; records the first
    step's learning rate and Adam step count."""
    from transformers import TrainerCallback

    class Chain(TrainerCallback):
        first_lr: float | None = None
        first_adam_step: int = 0
        loaded: bool = False

        def on_train_begin(self, args: Any, st: Any, control: Any, **kwargs: Any) -> None:
            trainer = trainer_ref["trainer"]
            if state is None or st.global_step > 0:  # nothing to chain, or resuming its own checkpoint
                return
            if trainer.is_deepspeed_enabled:
                from transformers.integrations.deepspeed import deepspeed_load_checkpoint

                # DeepSpeed's checkpoint holds the weights and Adam's state; the schedule is the
                # trainer's own (scheduler.pt), which this loads under DeepSpeed and nothing else.
                deepspeed_load_checkpoint(trainer.model_wrapped, state, load_module_strict=True)
            trainer._load_optimizer_and_scheduler(state)
            self.loaded = True
            log.info("stage chain: optimizer and schedule carried on from %s", state)

        def on_step_begin(self, args: Any, st: Any, control: Any, **kwargs: Any) -> None:
            if self.first_lr is not None:
                return
            optimizer = trainer_ref["trainer"].optimizer
            self.first_lr = float(optimizer.param_groups[0]["lr"])
            steps = [s.get("step") for s in optimizer.state.values() if "step" in s]
            self.first_adam_step = int(float(steps[0])) if steps else 0

    return Chain()


def last_lr(trainer: Any) -> float:
    return float(trainer.optimizer.param_groups[0]["lr"])


def keep_chain_state(work: Path, move: bool) -> str | None:
    """The newest checkpoint into ``work/chain_state`` once the trainer ended well (till then it
    is the resume point): moved where the checkpoints go anyway (tens of GB for a 3B model)."""
    from embodied_r.training.checkpoints import last_checkpoint

    newest, _ = last_checkpoint(work)
    if newest is None:
        return None
    target = work / CHAIN_STATE
    shutil.rmtree(target, ignore_errors=True)
    if move:
        os.replace(newest, target)
    else:
        shutil.copytree(newest, target)
    return str(target)


def keep_best_model(trainer: Any, work: Path) -> dict[str, Any]:
    best = trainer.state.best_model_checkpoint
    if not best or not Path(best).is_dir():
        return {"best_checkpoint": None}
    target = work / BEST_MODEL
    if trainer.accelerator.is_main_process:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(best, target, ignore=shutil.ignore_patterns("optimizer.pt", "scheduler.pt", "rng_state*",
                                                                     "global_step*", "*.bin.index.json"))
    return {"best_checkpoint": Path(best).name, "best_metric": trainer.state.best_metric,
            "best_model": str(target)}
