"""The ``embodied-reasoner`` recipes and their stage graph.

Recipes live in ``embodied_r/recipes/reasoner/`` (apart from the Embodied-R recipes, whose
schema differs). Stages, each a hashed folder under ``$EMBODIED_R_HOME/stages``:

  reasoner_data -> reasoner_sft_imitation -> reasoner_explore -> reasoner_sft_exploration
                -> reasoner_sft_correction -> reasoner_evaluate
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from embodied_r.backends.base import BackendConfig
from embodied_r.config import TrackingConfig, deep_merge, load_as
from embodied_r.interactive.download import ReasonerDataConfig
from embodied_r.interactive.episode import EpisodeConfig
from embodied_r.interactive.sft_config import ReasonerSFTConfig
from embodied_r.paths import home as default_home
from embodied_r.prompts.store import PromptsConfig
from embodied_r.settings import operational, result_settings
from embodied_r.stage_plan import Plan, PlanBuilder, Ref

RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "reasoner"


class ExploreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # dataset: the catalog's stage-2 trajectories; rollouts: the stage-1 model's successful
    # episodes in the environment (rejection sampling); both: the union.
    source: Literal["dataset", "rollouts", "both"] = "dataset"
    tasks: int = Field(33, ge=1)  # fresh training tasks in the built-in house
    samples_per_task: int = Field(2, ge=1)
    seed: int = 1


class EvaluateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    environment: Literal["builtin", "ai2thor"] = "builtin"
    # AI2-THOR only: the user's checkout of the original repository, whose hand-made
    # navigation poses (data/agent_positions.json) are read at run time, never shipped.
    original_checkout: str | None = None
    limit: int | None = Field(None, ge=1)  # the first N test cases; None: all
    batch: int = operational(8, ge=1)
    # Tasks split by a stable hash of their identity, run one shard after another, each with
    # its own resumable log (``interactive.evaluation``); the merged results do not depend on it.
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
    # CPU threads of torch in the SFT trainers, the rollouts and the evaluation; None: torch's
    # own (one per core). A tiny model gains nothing from a second thread, and on cores shared
    # with other work two threads ran a step 7-12x slower than one.
    torch_threads: int | None = operational(None, ge=1)

    @property
    def tracking(self) -> TrackingConfig:
        """Where its runs are logged, in the shape the run loop reads of every recipe (it
        registers no model: nothing to promote)."""
        return TrackingConfig(experiment=self.experiment, tracking_uri=self.tracking_uri)


def load(name_or_path: str, overrides: dict[str, Any] | None = None) -> ReasonerRecipe:
    return load_as(ReasonerRecipe, name_or_path, overrides, folder=RECIPES, reasoner=True)


SFT_STAGES = ("imitation", "exploration", "correction")


def plan(recipe: ReasonerRecipe, root: Path | None = None) -> Plan:
    """Every stage in run order, planned and keyed as Embodied-R's are (``stage_plan``)."""
    builder = PlanBuilder(Path(root) if root else default_home(), model=recipe.base_model)
    builder.add("reasoner_data", "reasoner_data", {"data": recipe.data.model_dump(mode="json")},
                keyed={"data": result_settings(recipe.data)})
    backend = recipe.backend.model_dump(mode="json")
    texts = recipe.evaluate.episode.model_dump(mode="json")["texts"]
    backend_keyed = result_settings(recipe.backend)
    threads = {"torch_threads": recipe.torch_threads}  # how the stages run, never in their keys
    for i, stage in enumerate(SFT_STAGES, start=1):
        sft = deep_merge(recipe.sft.model_dump(mode="json"), recipe.sft_stages.get(stage, {}))
        inputs: dict[str, str | Ref] = {"python": recipe.sft.python or ""}
        if stage == "exploration":
            # Rejection sampling: the stage-1 model's successful rollouts (or the dataset's).
            builder.add("reasoner_explore", "reasoner_explore",
                        {"explore": recipe.explore.model_dump(mode="json"), "backend": backend,
                         "episode": {"texts": texts}, **threads},
                        keyed={"explore": result_settings(recipe.explore), "backend": backend_keyed,
                               "episode": {"texts": texts}})
            inputs["trajectories"] = Ref("reasoner_explore")
        sft_keyed = result_settings(ReasonerSFTConfig.model_validate(sft))
        builder.add(f"reasoner_sft_{stage}", "reasoner_sft", {"stage": i, "name": stage, "sft": sft, **threads},
                    keyed={"stage": i, "name": stage, "sft": sft_keyed}, inputs=inputs)
    builder.add("reasoner_evaluate", "reasoner_evaluate",
                {"evaluate": recipe.evaluate.model_dump(mode="json"), "backend": backend, **threads},
                keyed={"evaluate": result_settings(recipe.evaluate), "backend": backend_keyed})
    return builder.plan("embodied-reasoner", recipe.model_dump(mode="json"))
