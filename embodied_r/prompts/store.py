"""The prompts file (texts, places, commit, files' sha256), the recipe's ``prompts`` section and what a file sets."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from embodied_r.errors import PromptsError
from embodied_r.paths import home
from embodied_r.prompts.locate import rename_fields

FORMAT_VERSION = 1
PARAPHRASE = "paraphrase"


class Text(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # A str.format template: ``text.format(**values)`` is the string the original code built.
    text: str
    fields: list[str] = []
    place: str = ""  # file:scope:holder, where the import found it


class PromptsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    repository: str
    url: str
    commit: str
    checkout: str
    options: dict[str, str] = {}
    files: dict[str, str]  # path in the checkout -> sha256
    texts: dict[str, Text]

    @property
    def label(self) -> str:
        return f"official@{self.commit[:12]}"

    def text(self, key: str, path: Path | str = "") -> Text:
        if key not in self.texts:
            raise PromptsError(f"prompts file {path or self.repository} has no text {key!r}; import the "
                               "checkout again with `embodied-r prompts import-official PATH`")
        return self.texts[key]


def default_path(root: Path, prompts: PromptsFile) -> Path:
    return Path(root) / "prompts" / f"{prompts.repository}-{prompts.commit[:12]}.json"


def write(prompts: PromptsFile, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(prompts.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def load(path: Path | str) -> PromptsFile:
    path = Path(path).expanduser()
    if not path.is_file():
        raise PromptsError(f"prompts file {path} not found: write it with "
                           "`embodied-r prompts import-official PATH` (PATH: your clone of the original repository)")
    try:
        data: Any = json.loads(path.read_text(encoding="utf-8"))
        prompts = PromptsFile.model_validate(data)
    except (ValueError, ValidationError) as exc:
        first = " ".join(str(exc).split())[:200]
        raise PromptsError(f"prompts file {path} is not a prompts file ({first}); import the checkout again") from None
    if prompts.format_version != FORMAT_VERSION:
        raise PromptsError(f"prompts file {path} has format {prompts.format_version}, this code reads "
                           f"{FORMAT_VERSION}; import the checkout again")
    return prompts


def content_hash(prompts: PromptsFile) -> str:
    """What a stage key holds of the file: its texts and its commit."""
    payload = json.dumps({"commit": prompts.commit, "texts": prompts.model_dump(mode="json")["texts"]},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


class PromptsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Written by `embodied-r prompts import-official PATH`, relative to the home; None: this project's wording.
    file: str | None = None
    # What the run records: "paraphrase", or "official@<commit>" (set from the file).
    source: str = PARAPHRASE


def resolve(file: str) -> Path:
    path = Path(file).expanduser()
    return path if path.is_absolute() else home() / path


def _question_block(prompts: PromptsFile, path: Path) -> str:
    """The preprocessing's question text after its "Question:" label (what the original's
    ``extract_qa`` keeps), its option lines under ``{options}``."""
    text = prompts.text("convert.question", path).text
    label = "Question:"
    if label not in text:
        raise PromptsError(f"convert.question in {path} has no {label!r} label; import the checkout again")
    return rename_fields(text[text.index(label) + len(label):].lstrip(), {"choices": "{options}"})


def embodied_r_settings(prompts: PromptsFile, path: Path) -> dict[str, Any]:
    if prompts.repository != "embodied-r":
        raise PromptsError(f"prompts file {path} holds {prompts.repository} texts; an Embodied-R recipe needs "
                           "an import of EmbodiedCity/Embodied-R.code")
    text = lambda key: prompts.text(key, path).text  # noqa: E731
    question = _question_block(prompts, path)
    label = prompts.label
    return {
        "prompts": {"source": label},
        "perception": {"texts": {
            "first_frame": rename_fields(text("perception.first_frame"), {"qa": "{question}"}),
            "pair": rename_fields(text("perception.pair"), {"qa": "{question}"}),
            "question": question,
            "source": label,
            "sha256": content_hash(prompts),
        }},
        "records": {
            "prompts": label,
            "system_prompt": prompts.text("convert.system", path).text.format(),
            "video_preamble": prompts.text("convert.video_preamble", path).text.format(),
            # The original strings the frames onto its preamble, each frame on a new line.
            "template": rename_fields(text("convert.user_turn"),
                                      {"video_content_str": "{preamble}\n{video_text}", "original_qa": "{question}"}),
            "question_template": question,
        },
        "training": {"scoring": {
            "reference_system": prompts.text("reference.system", path).text.format(),
            # The original reward reads the question back out of the user turn as "Question:"
            # and the text after the turn's last "Question:", stripped: the question block.
            "reference_template": rename_fields(text("reference.template"),
                                                {"question": "Question:{question}", "think_content": "{think}"}),
        }},
        "evaluation": {"prompts": label},
    }


# The original fills its module constants with format itself; its feedback is an f-string.
REASONER_CONSTANTS = ("system", "first_turn", "after_action", "after_move_forward", "after_error", "invalid_action")
REASONER_FEEDBACK = ("navigate_unmatched", "navigate_unreachable", "interact_unmatched", "interact_unavailable")


def reasoner_settings(prompts: PromptsFile, path: Path) -> dict[str, Any]:
    """The reasoner recipe values a prompts file of Embodied-Reasoner sets; the first turn is the
    original's local mode's ("put <object>"), which its released models ran in."""
    if prompts.repository != "embodied-reasoner":
        raise PromptsError(f"prompts file {path} holds {prompts.repository} texts; an Embodied-Reasoner recipe "
                           "needs an import of zwq2018/embodied_reasoner")
    texts = {key: prompts.text(f"reasoner.{key}", path).text.format() for key in REASONER_CONSTANTS}
    texts |= {f"feedback_{key}": prompts.text(f"reasoner.feedback_{key}", path).text for key in REASONER_FEEDBACK}
    return {"prompts": {"source": prompts.label},
            "evaluate": {"episode": {"texts": {**texts, "source": prompts.label}}}}


def apply_prompts(data: dict[str, Any], merge: Any, reasoner: bool = False) -> dict[str, Any]:
    """A raw recipe with the settings of the prompts file it names merged in by ``merge(base, over)``."""
    section = data.get("prompts") or {}
    file = section.get("file") if isinstance(section, dict) else None
    if not file:
        return data
    path = resolve(str(file))
    settings = reasoner_settings if reasoner else embodied_r_settings
    return merge(data, settings(load(path), path))
