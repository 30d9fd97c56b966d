"""The stage kinds: each declared once, here, and everything else derived from this table.

A stage kind names the function that runs it (``module:function``, imported only when the
stage runs), the work pool it runs on, how often Prefect retries it, its one-line help, what
its progress counts and which of its summary's figures make its headline. From this table
come the runners (``runners``), the Prefect tasks (``tasks/stages.py``), the stage flows and
their deployments (``flows/stages.py``, ``flows/reasoner.py``, checked against
``prefect.yaml`` by ``tests/test_architecture.py``), the CLI's stage commands, the pools the
full pipeline dispatches to, the unit an interrupted run names, and the graph: what each kind
reads (``inputs``), from which ``stage_plan.PlanBuilder`` derives every stage's input paths and
dependencies. Which stages a recipe has, with which config, is ``pipeline.plan``'s, and for
Embodied-Reasoner ``interactive.recipe.plan``'s.

This module imports nothing of the library: everything may read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

Pool = Literal["cpu", "gpu-infer", "gpu-train"]
# Which figure a stage's done line leads with (``tasks/stages.py``): an evaluation's accuracy,
# a trainer's steps and why it stopped, or items done and failed.
Headline = Literal["items", "training", "accuracy"]
Pipeline = Literal["embodied-r", "embodied-reasoner"]

REFRESH_NOTE = "Set refresh=true to recompute it and discard what depends on it."
# An input that is the model the stages before have reached: the ``model/`` of the last stage
# of a kind that ``makes_model``, else the model the pipeline starts from.
MODEL = "model"


@dataclass(frozen=True)
class StageKind:
    name: str
    runner: str  # "module:function", called as (out, config, inputs, mlflow_run_id) -> summary
    pool: Pool
    help: str  # the CLI's help line; the deployment's description starts with it
    # What it reads, by input name: "<kind>" the folder of that kind's last stage planned before
    # it, "<kind>/<path>" a path inside that folder, MODEL the model reached so far. An input
    # whose kind has no stage in a plan (an optional stage) is left out.
    inputs: Mapping[str, str] = field(default_factory=dict)
    makes_model: bool = False  # its folder's model/ is what the stages after it start from
    retries: int = 0  # whole-stage retries: each resumes per item, so one is cheap
    retry_delay_s: int = 0
    unit: str = "items"  # what its progress counts, as an interrupted run says it
    headline: Headline = "items"
    pipeline: Pipeline = "embodied-r"
    # What keys it beyond its config and code, as "module:function" of its config dict: the
    # download stage reads a local mirror whose content must key it.
    extra_key: str | None = None
    # Figures a stage's Prefect summary shows first, in this order, when present.
    figures: tuple[str, ...] = ()
    # Its trainer child logs its own arguments into the stage's MLflow run (under ``trainer.``),
    # so the recipe's settings go under the kind's name to read apart (``StagePlan.params``).
    self_reporting: bool = False
    # A CLI command of its own (``embodied-r <kind>``); promotion has the lifecycle's
    # ``embodied-r promote``, and reruns as ``embodied-r run --refresh promote``.
    command: bool = True
    # Its result lives in the MLflow store (the registry): with the store lost it cannot be
    # done, so the run leaves it to the rerun instead of failing on it.
    needs_tracking: bool = False
    summary_as_params: bool = False  # its run charts step curves: its summary's figures are params, not charts
    parent_view: str | None = None  # "module:function": what it shows on the run's MLflow parent, as the last evaluation

    @property
    def flow_name(self) -> str:
        return f"embodied-r-{self.name}" if self.pipeline == "embodied-r" else "embodied-reasoner-stage"

    @property
    def deployment_name(self) -> str:
        return self.name if self.pipeline == "embodied-r" else self.name.removeprefix("reasoner_")

    @property
    def deployment(self) -> str:
        """``<flow>/<deployment>`` as ``run_deployment`` and ``prefect deployment run`` take it."""
        return f"{self.flow_name}/{self.deployment_name}"

    @property
    def entrypoint(self) -> str:
        return (f"flows/stages.py:{self.name}_flow" if self.pipeline == "embodied-r"
                else "flows/reasoner.py:reasoner_stage")

    @property
    def description(self) -> str:
        """The deployment's description in ``prefect.yaml``."""
        return f"{self.help[0].upper()}{self.help[1:]}. {REFRESH_NOTE}"


ITEMS = ("items", "videos", "done", "failed", "keyframes_mean", "questions", "records")
TRAINING = ("steps", "epochs_reached", "stopped_by", "final_reward", "final_rewards_format_reward_mean",
            "final_rewards_accuracy_reward_mean", "final_kl", "done", "failed")
ACCURACY = ("accuracy/overall", "accuracy/macro", "accuracy/paper_tasks", "count/overall", "done", "failed")
TIMING = ("split", "seconds", "seconds_per_step")

CATALOG = "preprocess/catalog.parquet"

KINDS: tuple[StageKind, ...] = (
    StageKind("download", "embodied_r.data.download:run_stage", "cpu",
              "download the benchmarks (or make the synthetic one)", retries=2, retry_delay_s=10,
              unit="files", extra_key="embodied_r.data.download:fingerprint", figures=ITEMS + TIMING),
    StageKind("preprocess", "embodied_r.data.catalog:run_stage", "cpu",
              "build the questions catalog with splits", inputs={"raw": "download"}, figures=ITEMS + TIMING),
    StageKind("keyframes", "embodied_r.keyframes.stage:run_stage", "cpu",
              "extract key frames of every video", inputs={"catalog": CATALOG}, retries=1, unit="videos",
              figures=ITEMS + TIMING),
    StageKind("perception", "embodied_r.perception.stage:run_stage", "gpu-infer",
              "turn key frames into frame-by-frame text with the VLM",
              inputs={"catalog": CATALOG, "keyframes": "keyframes"},
              retries=2, retry_delay_s=30, unit="calls", figures=ITEMS + TIMING),
    StageKind("convert", "embodied_r.training.records:run_stage", "cpu", "write GRPO records",
              inputs={"catalog": CATALOG, "perception": "perception"}, figures=ITEMS + TIMING),
    StageKind("warmstart", "embodied_r.training.warmstart:run_stage", "gpu-train",
              "warm-start the policy on reasoning traces (recipes with a warmstart section)",
              inputs={"records": "convert", "init_model": MODEL}, makes_model=True, retries=1, retry_delay_s=30,
              unit="steps", headline="training", figures=TRAINING + TIMING, self_reporting=True, summary_as_params=True),
    StageKind("train", "embodied_r.training.stage:run_stage", "gpu-train", "run the GRPO training stages",
              inputs={"records": "convert", "init_model": MODEL}, makes_model=True, retries=1, retry_delay_s=30,
              unit="steps", headline="training", figures=TRAINING + TIMING, summary_as_params=True),
    StageKind("evaluate", "embodied_r.evaluation.stage:run_stage", "gpu-infer",
              "evaluate the trained reasoner on the test split", inputs={"records": "convert", "model": MODEL},
              retries=1, retry_delay_s=30, unit="questions", headline="accuracy", figures=ACCURACY + TIMING,
              parent_view="embodied_r.evaluation.parent:parent_view"),
    StageKind("promote", "embodied_r.evaluation.promotion:run_stage", "gpu-infer",
              "register the trained reasoner and give it @champion when it beats the bars",
              inputs={"records": "convert", "evaluation": "evaluate", "model": MODEL, "warm_model": "warmstart/model"},
              unit="models", figures=("registered_version", "promoted", "score"), command=False,
              needs_tracking=True),
    # Embodied-Reasoner (``embodied_r.interactive.recipe.plan``); its stages run from
    # ``embodied-r reasoner`` and the ``embodied-reasoner`` flows, not as commands of their own.
    StageKind("reasoner_data", "embodied_r.interactive.download:run_data_stage", "cpu",
              "fetch or build the Embodied-Reasoner trajectories and test cases", retries=1, retry_delay_s=10,
              extra_key="embodied_r.interactive.download:fingerprint", pipeline="embodied-reasoner",
              figures=ITEMS + TIMING),
    StageKind("reasoner_sft", "embodied_r.interactive.stages:run_sft_stage", "gpu-train",
              "fine-tune the VLM on one stage's trajectories",
              inputs={"catalog": "reasoner_data", "init_model": MODEL}, makes_model=True, retries=1, retry_delay_s=10, headline="training", pipeline="embodied-reasoner",
              figures=TRAINING + TIMING),
    StageKind("reasoner_explore", "embodied_r.interactive.stages:run_explore_stage", "gpu-infer",
              "gather exploration trajectories (the dataset's, or the model's successful rollouts)",
              inputs={"catalog": "reasoner_data", "model": MODEL}, retries=1, retry_delay_s=10,
              pipeline="embodied-reasoner", figures=ITEMS + TIMING),
    StageKind("reasoner_evaluate", "embodied_r.interactive.stages:run_evaluate_stage", "gpu-infer",
              "run the test episodes and score success, efficiency and completeness",
              inputs={"catalog": "reasoner_data", "model": MODEL}, retries=1, retry_delay_s=10, pipeline="embodied-reasoner",
              figures=ITEMS + TIMING),
)

STAGE_KINDS: dict[str, StageKind] = {k.name: k for k in KINDS}


def kind_of(name: str) -> StageKind:
    if name not in STAGE_KINDS:
        raise ValueError(f"unknown stage kind {name!r}; kinds are {', '.join(STAGE_KINDS)}")
    return STAGE_KINDS[name]


def kinds(pipeline: Pipeline) -> tuple[StageKind, ...]:
    """One pipeline's kinds, in run order."""
    return tuple(k for k in KINDS if k.pipeline == pipeline)


def kind_of_stage(stage: str) -> StageKind | None:
    """The kind a stage's name starts with (``train_stage2`` is a ``train``, ``evaluate_untrained``
    an ``evaluate``): the longest such kind, for names seen without their plan."""
    found = [k for k in KINDS if stage == k.name or stage.startswith(k.name + "_")]
    return max(found, key=lambda k: len(k.name)) if found else None
