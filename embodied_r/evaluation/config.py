"""The evaluation and promotion stages' configs and declarations."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from embodied_r.backends.base import BackendConfig
from embodied_r.benchmarks.base import Split
from embodied_r.errors import DEFAULT_MAX_FAILED_FRACTION
from embodied_r.scoring.answers import AnswerParser, ChoiceParser
from embodied_r.scoring.config import NumberParsing
from embodied_r.settings import operational, result_settings
from embodied_r.stage_plan import ACCURACY, MODEL, WARMSTART, Ref, StageKind
from embodied_r.tracking.config import TrackingConfig


def _greedy_backend() -> BackendConfig:
    return BackendConfig(temperature=0.0, max_new_tokens=2048)


class EvaluationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Greedy decoding; ``model`` is filled in with the checkpoint folder by the pipeline.
    backend: BackendConfig = Field(default_factory=_greedy_backend)
    # "ood": the evaluation-only benchmarks (EgoSchema, MVBench's egocentric tasks) named in
    # download.benchmarks, never trained on.
    split: Split = "test"
    # Which weights of the last training stage: its final ones, or its checkpoint with the
    # best validation accuracy (needs training.keep_best).
    checkpoint: Literal["last", "best_val"] = "last"
    # None keeps the backend's own limit.
    max_new_tokens: int | None = Field(None, ge=1)
    # A prompt longer than this many tokens loses its beginning, as in training (an in-process
    # model; a server bounds its own context). None: in a pipeline, the training's
    # max_prompt_length; alone, no limit.
    max_prompt_length: int | None = Field(None, ge=1)
    # The judge of logical consistency: given the question and the model's <think> text
    # only (no video text), does it reach the model's answer? The share of answers where
    # it does is the paper's "logically consistent" ratio (judged there by GPT-4o; here
    # any backend: a hosted API over `openai`, or a local model). None: not measured.
    consistency_judge: BackendConfig | None = None
    # How numeric answers are read: "official" as VSI-Bench's scorer (the text up to the
    # first space must be a number), "lenient" as the training reward ("about 3 m" is 3).
    number_parsing: NumberParsing = "official"
    # Also evaluate the policy before training and after the warm start, and report the
    # learning figures (accuracy of each beside chance, rewards per training stage).
    compare_baselines: bool = False
    # Questions whose call failed score 0; more of them than this share fails the stage.
    max_failed_fraction: float = operational(DEFAULT_MAX_FAILED_FRACTION, ge=0, le=1)
    # How option letters are read: "strict" only inside the last <answer> block, one
    # option and no other; "official" as the official scoring script (the first letter
    # right after <answer>, else the last "X." anywhere in the completion).
    answer_parser: AnswerParser = "strict"
    # Which texts the records and rewards were built with, for the report: "paraphrase", or
    # "official@<commit>" when the recipe's prompts file set them.
    prompts: str = "paraphrase"
    # Questions per generate call, and so between progress records.
    chunk_size: int = operational(32, ge=1)
    # Parts the questions are split into, each answered on its own and merged into the same
    # folder as one run; 1 = not split.
    shards: int = operational(1, ge=1)
    # A trained model to evaluate instead of training one: a folder, a hub id, or a folder of
    # a hub repository, hf://owner/repo/folder[@revision] (the `released` recipe: the authors'
    # checkpoints). Set, the pipeline plans no warm start and no training stage.
    model: str | None = None

    def answering_backend(self, model: str, **overrides: Any) -> BackendConfig:
        """``backend`` answering with ``model`` under this evaluation's token limits (new tokens,
        the prompt cut), then ``overrides`` that are set: how every evaluation asks a model."""
        update: dict[str, Any] = {"model": model}
        if self.max_new_tokens is not None:
            update["max_new_tokens"] = self.max_new_tokens
        if self.max_prompt_length is not None:
            update["max_prompt_tokens"] = self.max_prompt_length
        update.update({k: v for k, v in overrides.items() if v is not None})
        return self.backend.model_copy(update=update)

    def backends(self) -> list[tuple[str, BackendConfig | None, bool]]:
        # The evaluated model is the trained one: its name is filled in by the pipeline.
        return [("backend", self.backend, False), ("consistency_judge", self.consistency_judge, True)]

    def choice_parser(self) -> ChoiceParser:
        return "official_eval" if self.answer_parser == "official" else "strict"


def _settings(recipe: Any, builder: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The evaluation's config and keyed config, its judge the warm start's model where it says so."""
    evaluation = recipe.evaluation_settings()
    cfg, keyed = evaluation.model_dump(mode="json"), result_settings(evaluation)
    if cfg["consistency_judge"] is not None and cfg["consistency_judge"]["model"] == WARMSTART:
        cfg["consistency_judge"]["model"] = keyed["consistency_judge"]["model"] = builder.warm_model(
            "evaluation.consistency_judge")
    return cfg, keyed


def _evaluations(recipe: Any, builder: Any, kind: StageKind) -> None:
    if recipe.evaluation.model is not None:
        # A given model (the authors' released weights): no warm start, no training.
        evaluation = recipe.evaluation_settings()
        builder.add(kind, "evaluate", evaluation.model_dump(mode="json"), keyed=result_settings(evaluation),
                    inputs={"model": str(recipe.evaluation.model)})
        return
    cfg, keyed = _settings(recipe, builder)
    baselines: dict[str, str | Ref] = {}
    if recipe.evaluation.compare_baselines:
        # The same questions answered before any training and after the warm start, so the
        # report shows what each phase added.
        baselines["untrained"] = recipe.training.policy
        if WARMSTART in builder.stages:
            baselines["warmstart"] = Ref(WARMSTART, "model")
    for label, model in baselines.items():
        builder.add(kind, f"evaluate_{label}", cfg, keyed=keyed, inputs={"model": model})
    model = builder.model
    final: dict[str, Any] = {"model": Ref(model.stage, recipe.evaluated_checkpoint()) if isinstance(model, Ref)
                             else model}
    if baselines:
        # The learning figures: what each phase added, and each training stage's rewards.
        final["baselines"] = {b: Ref(f"evaluate_{b}") for b in baselines}
        final["training"] = {n: Ref(n) for n, sp in builder.stages.items() if sp.kind == "train"}
    builder.add(kind, "evaluate", cfg, keyed=keyed, inputs=final)


def _promotion(recipe: Any, builder: Any, kind: StageKind) -> None:
    if not recipe.tracking.promote:
        return
    from embodied_r.paths import default_tracking_uri
    from embodied_r.tracking.store import tracking_uri

    cfg, keyed = _settings(recipe, builder)
    bars = recipe.tracking.model_dump(mode="json", include={"registered_model", "promote_split", "promote_metric"})
    # The registry it promotes in: another store is another promotion; the home's own store
    # is keyed as such, so a moved home keeps its promotion.
    store = tracking_uri(recipe.tracking.tracking_uri, builder.root)
    store_key = "the home's store" if store == default_tracking_uri(builder.root) else store
    builder.add(kind, "promote", {**bars, "store": store, "evaluation": cfg, "recipe": recipe.name,
                                  "experiment": recipe.tracking.experiment},
                keyed={**bars, "store": store_key, "evaluation": keyed},
                inputs={"home": str(builder.root)})


EVALUATE = StageKind("evaluate", "embodied_r.evaluation.stage:run_stage", "gpu-infer",
                     "evaluate the trained reasoner on the test split", section="evaluation", config=EvaluationConfig,
                     expand=_evaluations, inputs={"records": "convert", "model": MODEL}, retries=1, retry_delay_s=30,
                     unit="questions", headline="accuracy", figures=ACCURACY,
                     parent_view="embodied_r.evaluation.parent:parent_view")
PROMOTE = StageKind("promote", "embodied_r.evaluation.promotion:run_stage", "gpu-infer",
                    "register the trained reasoner and give it @champion when it beats the bars", section="tracking",
                    config=TrackingConfig, expand=_promotion,
                    inputs={"records": "convert", "evaluation": "evaluate", "model": MODEL,
                            "warm_model": "warmstart/model"},
                    unit="models", figures=("registered_version", "promoted", "score"), command=False,
                    needs_tracking=True)
