"""The Embodied-R training stages' configs and declarations: convert, the warm start and the
GRPO schedule (its trainer settings, rollouts with vLLM), and the SFT baseline's settings."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from embodied_r.backends.base import BackendConfig
from embodied_r.scoring.config import ScoringConfig
from embodied_r.scoring.reward_table import REWARDS
from embodied_r.settings import operational, result_settings
from embodied_r.stage_plan import ITEMS, MODEL, TRAINING, WARMSTART, StageKind
from embodied_r.training.environment import TrainerEnvironment
from embodied_r.training.sft_settings import SFTSettings
from embodied_r.training.grpo_settings import (GRPOSettings, SchedulerType, accumulation_for, launch_world,
                                               owned_names)
from embodied_r.training.records_config import RecordsConfig


class VLLMRollouts(BaseModel):
    """GRPOConfig's ``use_vllm`` and ``vllm_*``, besides ``OWN``."""

    model_config = ConfigDict(extra="forbid")

    # colocate: vLLM shares each training GPU; server: a `trl vllm-serve` elsewhere.
    mode: Literal["colocate", "server"] = "colocate"
    gpu_memory_utilization: float = operational(0.3, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_length: int | None = Field(None, ge=1)
    # Frees vLLM's weights and cache while the optimizer step runs (colocate only).
    enable_sleep_mode: bool = operational(False)
    server_base_url: str | None = operational(None)
    # Stop when the engine's and the policy's log-probabilities of a fixed completion differ by
    # more than sync_tolerance after a weight sync. fp32 agrees to about 1e-5; in bf16 set the
    # tolerance from the gap the first syncs log.
    sync_check: bool = operational(False)
    sync_tolerance: float = operational(1e-3, gt=0)
    # None: vLLM's auto, which runs a float32 checkpoint in bfloat16 (TRL passes no dtype).
    dtype: Literal["bfloat16", "float16", "float32"] | None = None

    OWN: ClassVar[frozenset[str]] = frozenset({"sync_check", "sync_tolerance", "dtype"})

    def grpo_kwargs(self) -> dict[str, Any]:
        # An unset optional field is left to TRL.
        kwargs: dict[str, Any] = {"use_vllm": True}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None and name not in self.OWN:
                kwargs[f"vllm_{name}"] = value
        return kwargs

    @model_validator(mode="after")
    def _check_sync(self) -> "VLLMRollouts":
        if (self.sync_check or self.dtype) and self.mode != "colocate":
            raise ValueError("training.vllm.sync_check and dtype concern the colocated engine: set mode: "
                             "colocate, or leave them out")
        return self


class GRPOStageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Part of a folder name (stages/train_<name>/): letters, digits, '-', '_' only.
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
    epochs: float = Field(1.0, gt=0)
    # Reward name -> weight (the paper's format:accuracy:consistency 7:3:0, 3:7:0, 1:7:2). A weight
    # of 0 leaves the reward out, so a reference it would ask is never loaded.
    rewards: dict[str, Annotated[float, Field(ge=0)]]

    @model_validator(mode="before")
    @classmethod
    def _weight_fields(cls, data: Any) -> Any:
        # Recipes written before the rewards mapping: the fix, not pydantic's "extra input".
        old = [k for k in data if str(k).endswith("_weight") and k[:-7] in REWARDS] if isinstance(data, dict) else []
        if old:
            mapping = ", ".join(f"{k.removesuffix('_weight')}: {data[k]}" for k in old)
            raise ValueError(f"stage {data.get('name')!r}: write rewards: {{{mapping}}} in place of "
                             f"{', '.join(old)}")
        return data

    @field_validator("rewards")
    @classmethod
    def _known_rewards(cls, rewards: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        stage = info.data.get("name")
        unknown = [n for n in rewards if n not in REWARDS]
        if unknown:
            raise ValueError(f"stage {stage!r}: unknown reward {unknown[0]!r}; the rewards are "
                             f"{', '.join(REWARDS)} (add one to embodied_r.scoring.reward_table.REWARDS)")
        if not any(w > 0 for w in rewards.values()):
            raise ValueError(f"stage {stage!r}: at least one reward weight must be positive")
        # The table's order: a recipe's order changes neither the stage's key nor the sum.
        return {n: rewards[n] for n in REWARDS if n in rewards}

    def scored(self) -> dict[str, float]:
            return {n: w for n, w in self.rewards.items() if w > 0}


def paper_stages() -> list[GRPOStageConfig]:
    return [
        GRPOStageConfig(name="stage1", epochs=2, rewards={"format": 0.7, "accuracy": 0.3, "consistency": 0.0}),
        GRPOStageConfig(name="stage2", epochs=2, rewards={"format": 0.3, "accuracy": 0.7, "consistency": 0.0}),
        GRPOStageConfig(name="stage3", epochs=8, rewards={"format": 0.1, "accuracy": 0.7, "consistency": 0.2}),
    ]


def _paper_reference() -> BackendConfig:
    # The official reward asked it for one letter.
    return BackendConfig(model="Qwen/Qwen2.5-VL-3B-Instruct", max_new_tokens=10, temperature=0.1)


class TrainingConfig(GRPOSettings, TrainerEnvironment):
    # The official scripts' policy, trained on text only; any causal LM folder, hub id or tiny:lm.
    policy: str = "Qwen/Qwen2.5-VL-3B-Instruct"
    # Frozen, never the policy. Every trainer process builds its own: on several GPUs, serve it.
    reference: BackendConfig = Field(default_factory=_paper_reference)
    # The original rewards consistency only for correct answers.
    consistency_requires_correct: bool = True
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    stages: list[GRPOStageConfig] = Field(default_factory=paper_stages, min_length=1)

    # A learning rate of 0 trains nothing while looking like training: refused unless asked.
    allow_zero_learning_rate: bool = False
    # Prompt tokens, chat template included; longer prompts lose their beginning, as ms-swift's
    # max_length (6144 in the official script) cut them.
    max_prompt_length: int | None = Field(6144, ge=1)
    # rollout_only: ms-swift 3.3's GRPO, the loss and KL pass see the whole prompt; both: the loss
    # sees the rollout's cut prompt (fits memory at any prompt length).
    prompt_cut: Literal["rollout_only", "both"] = "both"
    # Completions per optimizer step on any process count, the accumulation derived (and
    # gradient_accumulation_steps then null).
    completions_per_step: int | None = Field(None, ge=1)
    # resume: stage i+1 carries on stage i's optimizer state and one schedule over all stages;
    # fresh: a new optimizer and schedule per stage.
    stage_chain: Literal["resume", "fresh"] = "fresh"
    # same: a stage cut short by max_steps_per_stage sees the same first questions as the stage
    # before; offset: stage i's seed is seed + i - 1, so each draws other questions.
    stage_seeds: Literal["same", "offset"] = "same"
    # Validation on the val split every this many steps (logged as eval_*).
    eval_steps: int | None = Field(None, ge=1)
    # The best checkpoint by validation accuracy as best_model/ (evaluation's checkpoint: best_val).
    keep_best: bool = False
    max_steps_per_stage: int | None = Field(None, ge=1)  # a cap for the CPU demo
    vllm: VLLMRollouts | None = None  # None: rollouts with transformers' generate
    # The same gradients without the second copy DDP otherwise keeps (a full fp32 policy per process).
    ddp_gradient_as_bucket_view: bool = operational(False)
    # The card the recipe is planned for, in GiB as its driver reports it (`embodied-r check memory`).
    gpu_gib: float | None = operational(None, gt=0)
    log_completions: bool = operational(False)  # TRL's own console print of completions
    # A sample of completions with their rewards, an MLflow table every this many steps and at the end.
    completion_table_rows: int = operational(8, ge=0)
    completion_table_steps: int = operational(50, ge=1)
    # Further GRPOConfig arguments, passed through as they are.
    grpo_args: dict[str, Any] = Field(default_factory=dict)

    def backends(self) -> list[tuple[str, BackendConfig | None, bool]]:
        return [("reference", self.reference, True)]

    def world(self) -> int | None:
        return launch_world(self.launcher, self.accelerate_processes())

    def accumulation_steps(self, world: int) -> int:
        if self.completions_per_step is None:
            assert self.gradient_accumulation_steps is not None  # _check
            return self.gradient_accumulation_steps
        return accumulation_for(self.completions_per_step, self.per_device_train_batch_size, world,
                                self.num_generations)

    def grpo_settings(self, world: int = 1) -> dict[str, Any]:
        """Every name exists in GRPOConfig of TRL 1.16 with transformers 5.17 and 5.23."""
        return self.settings_kwargs(self.accumulation_steps(world))

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        if not (self.learning_rate > 0 or self.allow_zero_learning_rate):
            raise ValueError(f"training.learning_rate must be positive, not {self.learning_rate} "
                             "(a control run at 0 sets training.allow_zero_learning_rate)")
        if (self.completions_per_step is None) == (self.gradient_accumulation_steps is None):
            raise ValueError("set exactly one of training.completions_per_step and "
                             "training.gradient_accumulation_steps (the other null)")
        # Without an accelerate config the count is known only inside the launch: checked there again.
        processes = self.world()
        if processes is not None:
            per_step = processes * self.per_device_train_batch_size * self.accumulation_steps(processes)
            if per_step % self.num_generations:
                raise ValueError(
                    f"processes x per_device_train_batch_size x gradient_accumulation_steps = {per_step} "
                    f"completions per step must be divisible by num_generations = {self.num_generations}"
                )
        clash = sorted(OWNED_GRPO_ARGS & set(self.grpo_args))
        if clash:
            raise ValueError(f"grpo_args may not set {', '.join(clash)}: use the typed training fields "
                             "(stages, max_steps_per_stage, vllm, use_cpu, and the settings that change "
                             "results: learning_rate, loss_type, warmup_ratio, ...)")
        if self.vllm is not None and self.use_cpu:
            raise ValueError("vllm rollouts need a GPU; remove training.vllm or set use_cpu: false")
        if (self.vllm is not None and self.vllm.max_model_length is not None and self.max_prompt_length is not None
                and self.vllm.max_model_length < self.max_prompt_length + self.max_completion_length):
            raise ValueError(
                f"vllm.max_model_length ({self.vllm.max_model_length}) must hold a prompt and a completion: "
                f"at least max_prompt_length + max_completion_length = "
                f"{self.max_prompt_length + self.max_completion_length}"
            )
        if self.stage_chain == "resume" and self.save_only_model:
            raise ValueError("training.stage_chain: resume carries the optimizer state from stage to stage: "
                             "set save_only_model: false (or stage_chain: fresh)")
        if self.keep_best and self.eval_steps is None:
            raise ValueError("training.keep_best picks a checkpoint by validation: set training.eval_steps")
        if self.keep_best and self.lora is not None:
            raise ValueError("training.keep_best is not available with LoRA yet (its checkpoints hold only "
                             "the adapter): set keep_best: false or train without lora")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        return self


DEFAULT_THINK = "I compare what the video showed with each option before answering."


class SFTConfig(SFTSettings):
    # The paper's SFT baselines trained for a few epochs at a usual full fine-tuning rate.
    epochs: float = Field(3.0, gt=0)
    gradient_accumulation_steps: int = Field(8, ge=1)
    lr_scheduler_type: SchedulerType = "linear"
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    max_length: int = Field(6144, ge=16)  # the original trained with 6144
    # Prompt tokens kept from the end, as the GRPO stages cut them: taught on what it is later asked.
    max_prompt_length: int | None = Field(None, ge=1)
    think: str = Field(DEFAULT_THINK, min_length=1)

    @classmethod
    def from_training(cls, training: TrainingConfig, **updates: Any) -> "SFTConfig":
        """The GRPO stages' device, launcher, LoRA and step cap; SFT's own learning rate and batch."""
        shared = set(TrainerEnvironment.model_fields)
        data = training.model_dump(include=shared)
        data["max_steps"] = training.max_steps_per_stage
        data.update(updates)
        return cls.model_validate(data)


# GRPOConfig arguments this config sets itself: grpo_args may not override them.
OWNED_GRPO_ARGS = owned_names(
    {"output_dir", "run_name", "num_train_epochs", "max_steps", "reward_weights", "report_to", "use_cpu",
     "use_vllm", "eval_strategy", "eval_steps", "per_device_eval_batch_size", "metric_for_best_model",
     "greater_is_better"},
    set(VLLMRollouts.model_fields) - VLLMRollouts.OWN,
)


class WarmstartConfig(SFTConfig):
    epochs: float = Field(2.0, gt=0)
    learning_rate: float = Field(3e-3, gt=0)
    # "answer": the frames' actions and the question's words they show, then the answer; "fact":
    # the perception words that decide the question (the record's ``fact``), then the option.
    trace: Literal["answer", "fact"] = "answer"
    max_actions: int = Field(4, ge=0)  # "answer": frames whose action the trace names
    # "answer": question words the frames showed; "fact": objects whose place it quotes.
    max_objects: int = Field(2, ge=0)
    reference_examples: bool = True


def _warm_start(recipe: Any, builder: Any, kind: StageKind) -> None:
    if recipe.warmstart is None or recipe.evaluation.model is not None:
        return
    cfg = recipe.warmstart.model_dump(mode="json", exclude={"python"})
    keyed = result_settings(recipe.warmstart)
    if cfg["max_prompt_length"] is None:
        # Taught on prompts cut as the GRPO stages and evaluation cut them.
        cfg["max_prompt_length"] = keyed["max_prompt_length"] = recipe.training.max_prompt_length
    # The trainer's interpreter travels as an input, not in the config it validates.
    builder.add(kind, WARMSTART, cfg, keyed=keyed, inputs={"python": recipe.warmstart.python or ""})


def _grpo_stages(recipe: Any, builder: Any, kind: StageKind) -> None:
    if recipe.evaluation.model is not None:
        return  # a given model (the authors' released weights): nothing is trained
    training = recipe.training.model_dump(mode="json", exclude={"stages", "python"})
    keyed = result_settings(recipe.training, exclude={"stages"})
    if training["reference"]["model"] == WARMSTART:
        training["reference"]["model"] = keyed["reference"]["model"] = builder.warm_model("training.reference")
    # Under stage_chain: resume one learning-rate schedule spans every stage: each needs them all.
    chain = ({"chain": [s.model_dump(mode="json") for s in recipe.training.stages]}
             if recipe.training.stage_chain == "resume" else {})
    for stage in recipe.training.stages:
        builder.add(kind, f"train_{stage.name}", {"stage": stage.model_dump(mode="json"), "training": training, **chain},
                    keyed={"stage": result_settings(stage), "training": keyed, **chain},
                    inputs={"python": recipe.training.python or ""})


CONVERT = StageKind("convert", "embodied_r.training.records:run_stage", "cpu", "write GRPO records",
                    section="records", config=RecordsConfig,
                    inputs={"catalog": "preprocess/catalog.parquet", "perception": "perception"}, figures=ITEMS)
WARMSTART_KIND = StageKind("warmstart", "embodied_r.training.warmstart:run_stage", "gpu-train",
                           "warm-start the policy on reasoning traces (recipes with a warmstart section)",
                           section="warmstart", config=WarmstartConfig, optional=True, expand=_warm_start,
                           inputs={"records": "convert", "init_model": MODEL}, makes_model=True, retries=1,
                           retry_delay_s=30, unit="steps", headline="training", figures=TRAINING,
                           self_reporting=True, summary_as_params=True)
TRAIN = StageKind("train", "embodied_r.training.stage:run_stage", "gpu-train", "run the GRPO training stages",
                  section="training", config=TrainingConfig, expand=_grpo_stages,
                  inputs={"records": "convert", "init_model": MODEL}, makes_model=True, retries=1, retry_delay_s=30,
                  unit="steps", headline="training", figures=TRAINING, summary_as_params=True)
