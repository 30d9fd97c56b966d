"""Embodied-Reasoner's recipe, its sections' configs and its stage kinds' declarations."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from embodied_r.backends.base import BackendConfig
from embodied_r.interactive import prompts
from embodied_r.interactive.sft_config import ReasonerSFTConfig
from embodied_r.merge import deep_merge
from embodied_r.prompts.store import PromptsConfig
from embodied_r.settings import operational, result_settings
from embodied_r.stage_plan import ITEMS, MODEL, TRAINING, Ref, StageKind
from embodied_r.tracking.config import TrackingConfig

HUB_REPO = "zwq2018/embodied_reasoner"


class ReasonerDataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: Literal["synthetic", "hub", "local"] = "synthetic"
    repo: str = HUB_REPO
    # Resolved to a commit and recorded; pin a commit hash in a recipe to freeze the data.
    revision: str = "main"
    endpoint: str | None = None
    source_dir: str | None = None  # local: a folder laid out like the hub repo
    synthetic_train: int = Field(33, ge=3)
    synthetic_test: int = Field(22, ge=1)
    seed: int = 0
    max_zip_bytes: int = operational(200 * 1024**3, ge=1)  # refuse image zips that would expand past this


class EpisodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_same_action: int = Field(3, ge=1)  # executions of one (verb, object) in a row
    max_idle_calls: int = Field(3, ge=1)  # replies in a row that did not act
    always_append_end: bool = True  # the original's behaviour
    # string: the offline rule of ``actions``; embedding: the original's match (``matching``).
    matcher: Literal["string", "embedding"] = "string"
    match_threshold: float = Field(0.6, ge=0, le=1)  # the string rule's
    embedding_model: str = "BAAI/bge-small-en-v1.5"  # a local folder, or a hub id already in the cache
    embedding_threshold: float = Field(0.2, ge=-1, le=1)  # cosine; the original's
    # drop: left out of every mean and counted apart, the original's way; score_as_failure: an error step.
    failed_generation: Literal["drop", "score_as_failure"] = "score_as_failure"
    # Retry a failed call as the original's inference server does (``retry``).
    retry_long_context: bool = False
    step_limit: int | None = None  # None: the task type's limit (22/24/30/36)
    # The original's texts, set from the recipe's prompts file; None: this project's wording.
    texts: prompts.ReasonerTexts | None = None


class ExploreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # rollouts: the stage-1 model's successful episodes (rejection sampling); both: the union.
    source: Literal["dataset", "rollouts", "both"] = "dataset"
    tasks: int = Field(33, ge=1)  # fresh training tasks in the built-in house
    samples_per_task: int = Field(2, ge=1)
    seed: int = 1


class EvaluateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    environment: Literal["builtin", "ai2thor"] = "builtin"
    # AI2-THOR: a checkout of the original, whose hand-made poses are read at run time, never shipped.
    original_checkout: str | None = None
    limit: int | None = Field(None, ge=1)  # the first N test cases; None: all
    batch: int = operational(8, ge=1)
    # Run one after another, each with its own resumable log; the merged results do not depend on it.
    shards: int = operational(1, ge=1)
    episode: EpisodeConfig = Field(default_factory=EpisodeConfig)


class ReasonerRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    base_model: str = "tiny:vlm"
    data: ReasonerDataConfig = Field(default_factory=ReasonerDataConfig)
    sft: ReasonerSFTConfig = Field(default_factory=ReasonerSFTConfig)
    # Per-stage changes to ``sft`` (keys imitation, exploration, correction).
    sft_stages: dict[str, dict[str, Any]] = Field(default_factory=dict)
    explore: ExploreConfig = Field(default_factory=ExploreConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)  # sampling for rollouts and evaluation
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    experiment: str = "embodied-reasoner"
    tracking_uri: str | None = None
    # The original's texts from the user's checkout (``prompts.file``), or this project's own.
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    # torch's CPU threads in the trainers, rollouts and evaluation (None: one per core): on shared
    # cores two threads ran a tiny model's step 7-12x slower than one.
    torch_threads: int | None = operational(None, ge=1)

    @property
    def tracking(self) -> TrackingConfig:
        """Where its runs are logged, as the run loop reads it of every recipe (no model to register)."""
        return TrackingConfig(experiment=self.experiment, tracking_uri=self.tracking_uri)


SFT_STAGES = ("imitation", "exploration", "correction")
# How the stages run, never in their keys.
_THREADS = "torch_threads"


def _data(recipe: ReasonerRecipe, builder: Any, kind: StageKind) -> None:
    builder.add(kind, kind.name, {"data": recipe.data.model_dump(mode="json")},
                keyed={"data": result_settings(recipe.data)})


def _sft_stages(recipe: ReasonerRecipe, builder: Any, kind: StageKind) -> None:
    """The three SFT stages, with rejection sampling (the explore stage) after the first."""
    threads = {_THREADS: recipe.torch_threads}
    for i, stage in enumerate(SFT_STAGES, start=1):
        sft = deep_merge(recipe.sft.model_dump(mode="json"), recipe.sft_stages.get(stage, {}))
        inputs: dict[str, str | Ref] = {"python": recipe.sft.python or ""}
        if stage == "exploration":
            backend = recipe.backend.model_dump(mode="json")
            texts = recipe.evaluate.episode.model_dump(mode="json")["texts"]
            builder.add(REASONER_EXPLORE, REASONER_EXPLORE.name,
                        {"explore": recipe.explore.model_dump(mode="json"), "backend": backend,
                         "episode": {"texts": texts}, **threads},
                        keyed={"explore": result_settings(recipe.explore), "backend": result_settings(recipe.backend),
                               "episode": {"texts": texts}})
            inputs["trajectories"] = Ref(REASONER_EXPLORE.name)
        sft_keyed = result_settings(ReasonerSFTConfig.model_validate(sft))
        builder.add(kind, f"reasoner_sft_{stage}", {"stage": i, "name": stage, "sft": sft, **threads},
                    keyed={"stage": i, "name": stage, "sft": sft_keyed}, inputs=inputs)


def _placed_by_sft(recipe: ReasonerRecipe, builder: Any, kind: StageKind) -> None:
    """Rejection sampling sits between SFT stages: the SFT kind's expansion places it."""


def _evaluation(recipe: ReasonerRecipe, builder: Any, kind: StageKind) -> None:
    builder.add(kind, kind.name, {"evaluate": recipe.evaluate.model_dump(mode="json"),
                                  "backend": recipe.backend.model_dump(mode="json"), _THREADS: recipe.torch_threads},
                keyed={"evaluate": result_settings(recipe.evaluate), "backend": result_settings(recipe.backend)})


_PIPELINE = "embodied-reasoner"
REASONER_DATA = StageKind("reasoner_data", "embodied_r.interactive.download:run_data_stage", "cpu",
                          "fetch or build the Embodied-Reasoner trajectories and test cases", expand=_data, retries=1,
                          retry_delay_s=10, extra_key="embodied_r.interactive.download:fingerprint", pipeline=_PIPELINE,
                          figures=ITEMS)
REASONER_SFT = StageKind("reasoner_sft", "embodied_r.interactive.stages:run_sft_stage", "gpu-train",
                         "fine-tune the VLM on one stage's trajectories", expand=_sft_stages,
                         inputs={"catalog": "reasoner_data", "init_model": MODEL}, makes_model=True, retries=1,
                         retry_delay_s=10, headline="training", pipeline=_PIPELINE, figures=TRAINING)
REASONER_EXPLORE = StageKind("reasoner_explore", "embodied_r.interactive.stages:run_explore_stage", "gpu-infer",
                             "gather exploration trajectories (the dataset's, or the model's successful rollouts)",
                             expand=_placed_by_sft, inputs={"catalog": "reasoner_data", "model": MODEL}, retries=1,
                             retry_delay_s=10, pipeline=_PIPELINE, figures=ITEMS)
REASONER_EVALUATE = StageKind("reasoner_evaluate", "embodied_r.interactive.stages:run_evaluate_stage", "gpu-infer",
                              "run the test episodes and score success, efficiency and completeness",
                              expand=_evaluation, inputs={"catalog": "reasoner_data", "model": MODEL}, retries=1,
                              retry_delay_s=10, pipeline=_PIPELINE, figures=ITEMS)
