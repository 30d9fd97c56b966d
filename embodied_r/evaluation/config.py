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

    # Greedy; the pipeline fills in ``model``.
    backend: BackendConfig = Field(default_factory=_greedy_backend)
    # "ood": the evaluation-only benchmarks named in download.benchmarks, never trained on.
    split: Split = "test"
    # The last training stage's final weights, or its best validation checkpoint (training.keep_best).
    checkpoint: Literal["last", "best_val"] = "last"
    # None keeps the backend's own limit.
    max_new_tokens: int | None = Field(None, ge=1)
    # A longer prompt loses its beginning, as in training (in process; a server bounds its own
    # context). None: in a pipeline, the training's max_prompt_length; alone, no limit.
    max_prompt_length: int | None = Field(None, ge=1)
    # Does the question and the <think> text alone (no video text) reach the model's answer? The
    # share where it does is the paper's "logically consistent" ratio (any backend). None: not measured.
    consistency_judge: BackendConfig | None = None
    # "official": VSI-Bench's scorer (the text up to the first space is a number); "lenient": the
    # training reward's ("about 3 m" is 3).
    number_parsing: NumberParsing = "official"
    # Also the policy before training and after the warm start, with the learning figures.
    compare_baselines: bool = False
    # Questions whose call failed score 0; more of them than this share fails the stage.
    max_failed_fraction: float = operational(DEFAULT_MAX_FAILED_FRACTION, ge=0, le=1)
    # "strict": one option, inside the last <answer> block only; "official": the official script's
    # (the first letter right after <answer>, else the last "X." anywhere).
    answer_parser: AnswerParser = "strict"
    # For the report: "paraphrase", or "official@<commit>" when the recipe's prompts file set them.
    prompts: str = "paraphrase"
    # Questions per generate call, and so between progress records.
    chunk_size: int = operational(32, ge=1)
    # Parts answered on their own and merged into one folder; 1 = not split.
    shards: int = operational(1, ge=1)
    # A trained model instead of training one (a folder, a hub id, hf://owner/repo/folder[@rev]):
    # the pipeline then plans no warm start and no training stage.
    model: str | None = None

    def answering_backend(self, model: str, **overrides: Any) -> BackendConfig:
        """``backend`` answering with ``model`` under this evaluation's token limits, then the
        ``overrides`` that are set: how every evaluation asks a model."""
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
    evaluation = recipe.evaluation_settings()
    cfg, keyed = evaluation.model_dump(mode="json"), result_settings(evaluation)
    if cfg["consistency_judge"] is not None and cfg["consistency_judge"]["model"] == WARMSTART:
        cfg["consistency_judge"]["model"] = keyed["consistency_judge"]["model"] = builder.warm_model(
            "evaluation.consistency_judge")
    return cfg, keyed


def _evaluations(recipe: Any, builder: Any, kind: StageKind) -> None:
    if recipe.evaluation.model is not None:
        evaluation = recipe.evaluation_settings()
        builder.add(kind, "evaluate", evaluation.model_dump(mode="json"), keyed=result_settings(evaluation),
                    inputs={"model": str(recipe.evaluation.model)})
        return
    cfg, keyed = _settings(recipe, builder)
    baselines: dict[str, str | Ref] = {}
    if recipe.evaluation.compare_baselines:
        # The same questions before any training and after the warm start: what each phase added.
        baselines["untrained"] = recipe.training.policy
        if WARMSTART in builder.stages:
            baselines["warmstart"] = Ref(WARMSTART, "model")
    for label, model in baselines.items():
        builder.add(kind, f"evaluate_{label}", cfg, keyed=keyed, inputs={"model": model})
    model = builder.model
    final: dict[str, Any] = {"model": Ref(model.stage, recipe.evaluated_checkpoint()) if isinstance(model, Ref)
                             else model}
    if baselines:
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
    # Another store is another promotion; the home's own is keyed as such, so a moved home keeps it.
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
