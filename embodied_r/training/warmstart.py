"""The warm start: a short SFT on reasoning traces of the train split, so GRPO starts from a
policy that writes the format (a random one earns no reward, so no advantage, and GRPO updates
nothing). With ``reference_examples`` it also learns the consistency reference's task, so a
frozen copy can serve as a reference that reads the reasoning."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from embodied_r.scoring.reference_prompts import REFERENCE_SYSTEM, REFERENCE_TEMPLATE_CHOICE, REFERENCE_TEMPLATE_NUMBER
from embodied_r.training.config import WarmstartConfig
from embodied_r.training.sft import run_sft, sft_target
from embodied_r.training.traces import UNKNOWN, fact_think, frames

_WORD_RE = re.compile(r"[a-z]+")
# Words too common to tie a frame to a question.
_STOP = frozenset("""a an the of to in on at by for with from into is are was be i you my your me it
this that which what where when how many much do does did can or and not if then your there
question options choose choices following""".split())


def question_words(question: str) -> list[str]:
    seen: dict[str, None] = {}
    for word in _WORD_RE.findall(question.lower()):
        if len(word) > 2 and word not in _STOP:
            seen.setdefault(word, None)
    return list(seen)


def think_text(record: dict[str, Any], max_actions: int = 4, max_objects: int = 2) -> str:
    """What the frames say that bears on the question, then the conclusion: from the record's
    own prompt and gold answer only."""
    seen = frames(record["prompt"])
    actions = [a for _, a, _ in seen if a and a != UNKNOWN][:max_actions]
    words = question_words(record["question"])
    observed = " ".join(o.lower() for _, _, o in seen)
    shown = [w for w in words if w in observed][:max_objects]
    parts = []
    if actions:
        parts.append("I " + ", then ".join(actions) + ".")
    if shown:
        parts.append("I see " + " and ".join(shown) + ".")
    parts.append(f"So {record['solution']}{_option_gist(record)}.")
    return " ".join(parts)


def _option_gist(record: dict[str, Any], words: int = 6) -> str:
    letter = str(record["solution"])
    for option in record.get("options") or []:
        text = str(option).strip()
        if text[:1].upper() == letter and text[1:2] in (".", ")", ":"):
            gist = " ".join(text[2:].strip().rstrip(".").split()[:words])
            return f": {gist}" if gist else ""
    return ""


def trace(record: dict[str, Any], max_actions: int = 4, max_objects: int = 2) -> str:
    return sft_target(record, think_text(record, max_actions, max_objects))


def reference_example(record: dict[str, Any], think: str) -> dict[str, Any]:
    template = REFERENCE_TEMPLATE_NUMBER if record["answer_type"] == "number" else REFERENCE_TEMPLATE_CHOICE
    return {**record, "uid": f"{record['uid']}#reference", "system": REFERENCE_SYSTEM,
            "prompt": template.format(question=record["question"], think=think),
            "target": str(record["solution"])}


def traces(records: list[dict[str, Any]], cfg: WarmstartConfig) -> list[dict[str, Any]]:
    rows = []
    for record in records:
        if record.get("split") != "train":
            raise ValueError(f"warm start: record {record['uid']} is from split {record.get('split')!r}; "
                             "traces are written for the train split only")
        think = (fact_think(record, cfg.max_objects) if cfg.trace == "fact"
                 else think_text(record, cfg.max_actions, cfg.max_objects))
        rows.append({**record, "target": sft_target(record, think)})
        if cfg.reference_examples:
            rows.append(reference_example(record, think))
    return rows


def run_warmstart(records: Path, init_model: str, out: Path, cfg: WarmstartConfig,
                  mlflow_run_id: str | None = None) -> dict[str, Any]:
    rows = pq.read_table(Path(records) / "train.parquet").to_pylist()
    summary = run_sft(Path(records), init_model, Path(out), cfg, mlflow_run_id=mlflow_run_id,
                      traces=traces(rows, cfg), stage="warmstart")
    return {**summary, "stage": "warmstart"}


def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    cfg = WarmstartConfig.model_validate({**config, "python": inputs.get("python") or None})
    return run_warmstart(Path(inputs["records"]), inputs["init_model"], out, cfg, mlflow_run_id=mlflow_run_id)
