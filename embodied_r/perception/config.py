"""The perception stage's config and declaration."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from embodied_r.backends.base import BackendConfig
from embodied_r.errors import DEFAULT_MAX_FAILED_FRACTION
from embodied_r.perception import prompts
from embodied_r.perception.prompts import ImageOrder, PerceiverTexts, PromptStyle, ReplyFormat
from embodied_r.settings import operational
from embodied_r.stage_plan import ITEMS, StageKind

SUPPORTED_PROMPT_VERSIONS = {prompts.PROMPT_VERSION}


# Qwen2.5-VL's own ceiling (its processor's default): full frames, as the official code sent.
FULL_RESOLUTION_PIXELS = 16384 * 28 * 28


def _paper_perceiver() -> BackendConfig:
    return BackendConfig(kind="openai", model="Qwen/Qwen2.5-VL-72B-Instruct", base_url="http://127.0.0.1:8000/v1",
                         max_new_tokens=4096, max_pixels=FULL_RESOLUTION_PIXELS)


class PerceptionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: BackendConfig = Field(default_factory=_paper_perceiver)
    mode: Literal["per_question", "per_video"] = "per_question"
    # The defaults are the official code's; "images_first" lets a server's prefix cache share
    # the frames across their questions.
    reply_format: ReplyFormat = "numbered"
    image_order: ImageOrder = "text_first"
    system_message: bool = False
    # Before the question-related part of each frame's text; "" joins it with a space, as
    # the official text does.
    question_label: str = ""
    # The official calls set none; 4096 is far beyond any reply seen.
    max_new_tokens: int = Field(4096, ge=1)
    # per_video: key frames shown in one question pass, and its reply budget.
    question_window: int = Field(32, ge=2)
    question_max_new_tokens: int = Field(4096, ge=1)
    # With reply_format json, hold replies to the schema where the backend can.
    structured_output: bool = True
    prompt_version: str = prompts.PROMPT_VERSION
    # The original texts, from the recipe's ``prompts.file``; None: this project's.
    texts: PerceiverTexts | None = None
    # A question a call failed for: dropped, or kept with the official text's "None" there.
    on_failure: Literal["drop", "keep_placeholder"] = "drop"
    # The `released` recipe: its reasoner read the authors' perceiver's texts.
    texts_required: bool = operational(False)
    # More failed questions than this share fails the stage (kept .partial, never cached).
    max_failed_fraction: float = operational(DEFAULT_MAX_FAILED_FRACTION, ge=0, le=1)
    # Parts the videos are split into, each run on its own and merged as one run.
    shards: int = operational(1, ge=1)

    @field_validator("prompt_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value not in SUPPORTED_PROMPT_VERSIONS:
            raise ValueError(f"prompt_version {value!r} is not available in this code "
                             f"(available: {sorted(SUPPORTED_PROMPT_VERSIONS)})")
        return value

    @model_validator(mode="after")
    def _texts_fit(self) -> "PerceptionConfig":
        if self.texts is not None and (self.mode, self.reply_format) != ("per_question", "numbered"):
            raise ValueError(f"perception: the prompts file's texts ({self.texts.source}) are the original "
                             "per-question prompts; set perception.mode: per_question and reply_format: numbered")
        return self

    def style(self) -> PromptStyle:
        return PromptStyle(self.reply_format, self.image_order, self.system_message, self.texts)

    def plan(self) -> Any:
        from embodied_r.perception.modes import make_mode

        return make_mode(self.mode, self.question_window, self.style())

    def video_text(self, frames: list[Any]) -> str:
        from embodied_r.perception.parse import video_text

        return video_text(frames, self.question_label)

    def backends(self) -> list[tuple[str, BackendConfig | None, bool]]:
        """The backends it starts: (field, config, whether it must name a model)."""
        return [("backend", self.backend, True)]

    def missing_before_run(self) -> list[str]:
        """A recipe that needs the user's prompts file still validates; its run stops before the
        key frames."""
        found = []
        if self.texts_required and self.texts is None:
            found.append("prompts.file: this recipe needs the original texts; write them with `embodied-r prompts "
                         "import-official PATH` (your clone of EmbodiedCity/Embodied-R.code) and add --set "
                         "prompts.file=FILE")
        return found


PERCEPTION = StageKind("perception", "embodied_r.perception.stage:run_stage", "gpu-infer",
                       "turn key frames into frame-by-frame text with the VLM", section="perception",
                       config=PerceptionConfig, inputs={"catalog": "preprocess/catalog.parquet", "keyframes": "keyframes"},
                       retries=2, retry_delay_s=30, unit="calls", figures=ITEMS)
