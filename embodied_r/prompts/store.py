"""The prompts file: the texts taken from a checkout, where each was found, the checkout's
commit and the sha256 of every file read. It is written under the home and named by a
recipe (``prompts.file``); the run records ``official@<commit>`` from it."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from embodied_r.prompts.locate import PromptsError

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
    """What a stage key holds of the file: its texts and where they came from."""
    payload = json.dumps({"commit": prompts.commit, "texts": prompts.model_dump(mode="json")["texts"]},
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()
