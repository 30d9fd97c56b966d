"""Evaluation: answer every record of a split with a model and score it.

Generation goes through the shared backends (in process, an OpenAI-compatible server,
or vLLM), greedy by default. Progress is logged per question, so an interrupted
evaluation resumes where it stopped. A question whose generation failed (the backend's
error, after its retries) is recorded as a failure and left out of the accuracy; an
answer that cannot be parsed is a wrong answer and counts.

The model is a checkpoint folder, a hub id, ``tiny:lm``, or a registry URI such as
``models:/embodied-r-reasoner@champion`` (resolved to a local folder first).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from embodied_r import progress, schemas
from embodied_r.backends import Backend, BackendConfig, Conversation, make_backend
from embodied_r.io import (
    ItemLog,
    is_complete,
    read_summary,
    stage_folder,
    table_from_records,
    write_json_atomic,
    write_parquet_atomic,
    write_summary,
)
from embodied_r.metrics import NumberParsing, aggregate, category_table, score_answer, subtask_of
from embodied_r.report import PAPER_ACCURACY, PAPER_AVERAGE, write_report

__all__ = ["EvaluationConfig", "PAPER_ACCURACY", "PAPER_AVERAGE", "Reasoner", "converted_records", "evaluate_model",
           "evaluate_records", "evaluation_folder", "read_split", "resolve_model_ref", "resolve_reasoner",
           "run_evaluation", "score_row", "trained_model"]

CHAMPION_URI = "models:/embodied-r-reasoner@champion"


def _greedy_backend() -> BackendConfig:
    return BackendConfig(temperature=0.0, max_new_tokens=2048)


class EvaluationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Greedy decoding; ``model`` is filled in with the checkpoint folder by the pipeline.
    backend: BackendConfig = Field(default_factory=_greedy_backend)
    split: str = "test"
    # None keeps the backend's own limit.
    max_new_tokens: int | None = Field(None, ge=1)
    # The judge of logical consistency: given the question and the model's <think> text
    # only (no video text), does it reach the model's answer? The share of answers where
    # it does is the paper's "logically consistent" ratio (judged there by GPT-4o; here
    # any backend: a hosted API over `openai`, or a local model). None: not measured.
    consistency_judge: BackendConfig | None = None
    # How numeric answers are read: "official" as VSI-Bench's scorer (the text up to the
    # first space must be a number), "lenient" as the training reward ("about 3 m" is 3).
    number_parsing: NumberParsing = "official"
    # Questions per generate call, and so between progress records.
    chunk_size: int = Field(32, ge=1)


def _conversation(record: dict[str, Any]) -> Conversation:
    return [{"role": "system", "content": record["system"]}, {"role": "user", "content": record["prompt"]}]


def score_row(record: dict[str, Any], text: str, completion_tokens: int,
              number_parsing: NumberParsing = "official",
              answer_from: Literal["tag", "reply"] = "tag") -> dict[str, Any]:
    """The scored row of one record's completion. ``answer_from="reply"`` reads a reply
    without an ``<answer>`` block as the answer itself (models asked to answer directly)."""
    scored_text = text
    if answer_from == "reply" and "<answer>" not in (text or ""):
        scored_text = f"<answer>{text}</answer>"
    options = list(record.get("options") or [])
    prediction, score = score_answer(scored_text, record["solution"], record["answer_type"],
                                     len(options) or None, number_parsing=number_parsing)
    return {
        "uid": record["uid"],
        "benchmark": record["benchmark"],
        "category": record["category"],
        "subtask": subtask_of(record["category"], options),
        "solution": record["solution"],
        "answer_type": record["answer_type"],
        "completion": text,
        "prediction": prediction,
        "score": float(score),
        "completion_tokens": int(completion_tokens),
    }


def _judge(judge: Backend, records: list[dict[str, Any]], texts: list[str]) -> list[bool | None]:
    from embodied_r.rewards import consistency_ratio

    _, verdicts = consistency_ratio(
        judge, texts, [r["question"] for r in records], [r["answer_type"] for r in records],
        [r.get("options") or None for r in records],
    )
    return verdicts


def resolve_model_ref(model: str) -> str:
    """A local folder (or hub id) for ``model``: registry URIs and ``tiny:*`` are resolved."""
    if not model:
        raise ValueError("evaluation: no model given; pass a checkpoint folder, a hub id, tiny:lm "
                         "or a registry URI such as models:/embodied-r-reasoner@champion")
    if model.startswith("models:/"):
        from embodied_r.registry import resolve_model_uri

        return resolve_model_uri(model)
    from embodied_r.tiny_models import resolve_model

    return resolve_model(model)


def evaluation_folder(root: Path, kind: str, identity: dict[str, Any], cfg: BaseModel) -> Path:
    """``<root>/evaluations/<kind>/<hash>``: a folder named by what is evaluated (``identity``:
    model, records, ...), the config and the code, like a pipeline stage's folder."""
    from embodied_r.pipeline import code_version, module_version

    payload = json.dumps({"kind": kind, "identity": identity, "config": cfg.model_dump(mode="json"),
                          "code": code_version("evaluate"), "report": module_version("report"),
                          "baselines": module_version("baselines")}, sort_keys=True, default=str)
    return Path(root) / "evaluations" / kind / hashlib.sha256(payload.encode()).hexdigest()[:16]


def read_split(records: Path, split: str) -> list[dict[str, Any]]:
    split_file = Path(records) / f"{split}.parquet"
    if not split_file.is_file():
        raise FileNotFoundError(f"evaluation: {split_file} does not exist (run the convert stage first)")
    return pq.read_table(split_file).to_pylist()


def evaluate_records(
    all_records: list[dict[str, Any]],
    out: Path,
    backend_cfg: BackendConfig,
    cfg: EvaluationConfig,
    *,
    model_label: str,
    conversation: Callable[[dict[str, Any]], Conversation] = _conversation,
    answer_from: Literal["tag", "reply"] = "tag",
    title: str = "Evaluation",
    extra_summary: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Answer ``all_records`` with ``backend_cfg``, score, and write the stage folder ``out``:
    ``predictions.parquet``, ``failures.parquet``, ``metrics.json``, the report files
    (``report.REPORT_FILES``) and ``summary.json``. Resumes from its per-question log."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    started = time.monotonic()
    with stage_folder(out) as work:
        log = ItemLog(work / "items.jsonl", key="uid")
        done = log.done_ids()
        pending = [r for r in all_records if r["uid"] not in done]
        failures: list[dict[str, str]] = []
        backend = make_backend(backend_cfg) if pending else None
        judge = make_backend(cfg.consistency_judge) if (pending and cfg.consistency_judge is not None) else None
        try:
            for start in range(0, len(pending), cfg.chunk_size):
                chunk = pending[start : start + cfg.chunk_size]
                assert backend is not None
                generations = backend.generate([conversation(r) for r in chunk])
                ok = [(r, g) for r, g in zip(chunk, generations) if not g.error]
                failures += [
                    {"stage": "evaluate", "item": r["uid"], "reason": f"generation_error: {g.error}"}
                    for r, g in zip(chunk, generations) if g.error
                ]
                verdicts: list[bool | None] = [None] * len(ok)
                if judge is not None and ok:
                    verdicts = _judge(judge, [r for r, _ in ok], [g.text for _, g in ok])
                for (record, generation), verdict in zip(ok, verdicts):
                    row = score_row(record, generation.text, generation.completion_tokens,
                                    cfg.number_parsing, answer_from)
                    row["consistent"] = verdict
                    log.append(row)
                progress.update("evaluate", len(done) + start + len(chunk), len(all_records))
        finally:
            for b in (backend, judge):
                if b is not None:
                    b.close()

        order = {r["uid"]: i for i, r in enumerate(all_records)}
        rows = sorted((r for r in log.read() if r["uid"] in order), key=lambda r: order[r["uid"]])
        write_parquet_atomic(table_from_records(rows, schemas.PREDICTIONS), work / "predictions.parquet")
        write_parquet_atomic(table_from_records(failures, schemas.FAILURES), work / "failures.parquet")

        metrics = aggregate(rows)
        judged = [r["consistent"] for r in rows if r.get("consistent") is not None]
        if judged:
            metrics["consistency/ratio"] = sum(judged) / len(judged)
            metrics["consistency/judged"] = float(len(judged))
        categories = category_table(rows)
        write_json_atomic(work / "metrics.json", {"metrics": metrics, "categories": categories})
        write_report(work, categories, metrics, model=model_label, split=cfg.split, title=title)
        seconds = time.monotonic() - started
        summary: dict[str, Any] = {
            "model": model_label,
            "split": cfg.split,
            "items": len(all_records),
            "done": len(rows),
            "failed": len(failures),
            "failure_reasons": dict(Counter(f["reason"].split(":", 1)[0] for f in failures)),
            "seconds": round(seconds, 3),
            "seconds_per_item": round(seconds / len(pending), 4) if pending else None,
            **(extra_summary or {}),
            **metrics,
        }
        write_summary(work, summary)
    return summary


def run_evaluation(records: Path, model: str, out: Path, cfg: EvaluationConfig,
                   title: str = "Evaluation", model_ref: str | None = None) -> dict[str, Any]:
    """Answer and score every record of ``cfg.split`` with ``model``; write predictions,
    metrics and the report into ``out``. ``model_ref`` names the model in the report when
    ``model`` is a folder it was resolved to (e.g. a registry URI)."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    all_records = read_split(records, cfg.split)
    resolved = resolve_model_ref(model)
    update: dict[str, Any] = {"model": resolved}
    if cfg.max_new_tokens is not None:
        update["max_new_tokens"] = cfg.max_new_tokens
    ref = model_ref or (model if model != resolved else None)
    return evaluate_records(all_records, out, cfg.backend.model_copy(update=update), cfg,
                            model_label=f"{ref} ({resolved})" if ref else resolved, title=title,
                            extra_summary={"model": resolved, "model_ref": ref} if ref else None)


# -- a recipe's records and models ---------------------------------------------------------


def trained_model(recipe: Any, root: Path) -> str:
    """The recipe's last trained stage's model folder; raises when it has not been trained."""
    from embodied_r.pipeline import StageError, plan, training_stage_names

    stages = plan(recipe, root)
    last = stages[training_stage_names(stages)[-1]]
    if not last.complete:
        raise StageError(
            f"recipe {recipe.name!r} has no trained reasoner yet ({last.name} not run): pass a model "
            f"(a folder, tiny:lm, {CHAMPION_URI}) or run `embodied-r run --recipe {recipe.name}` first")
    return str(Path(last.out) / "model")


def converted_records(recipe: Any, root: Path) -> Path:
    """The recipe's convert-stage folder; raises when it has not been run."""
    from embodied_r.pipeline import StageError, plan

    convert = plan(recipe, root)["convert"]
    if not convert.complete:
        raise StageError(f"no converted records for recipe {recipe.name!r}: run `embodied-r convert --recipe "
                         f"{recipe.name}` (or the whole pipeline) first")
    return Path(convert.out)


@dataclass(frozen=True)
class Reasoner:
    identity: str  # what an evaluation folder is keyed by: immutable where possible
    path: str  # the local folder (or hub id) backends load
    label: str | None = None  # the registry version, for reports


def resolve_reasoner(ref: str | None, recipe: Any, root: Path) -> Reasoner:
    """Where a model reference points (default: the recipe's trained model); registry URIs
    are pinned to the version their alias names now."""
    ref = ref or trained_model(recipe, root)
    if ref.startswith("models:/"):
        from embodied_r.registry import resolve_model_uri, resolve_version
        from embodied_r.tracking import tracking_uri

        store = tracking_uri(recipe.tracking.tracking_uri, root)
        pinned = resolve_version(ref, store).uri
        return Reasoner(f"{pinned}@{store}", resolve_model_uri(pinned, store), pinned)
    resolved = resolve_model_ref(ref)
    return Reasoner(str(Path(resolved).resolve()) if Path(resolved).exists() else resolved, resolved)


def evaluate_model(recipe: Any, ref: str | None, split: str, root: Path,
                   out: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Evaluate a model reference on ``split`` of the recipe's converted records, in a
    folder named by the pinned model, the records and the config; (folder, summary)."""
    records = converted_records(recipe, root)
    if not read_split(records, split):
        raise ValueError(f"the {split} split of recipe {recipe.name!r} has no records ({records}); "
                         "choose another split")
    model = resolve_reasoner(ref, recipe, root)
    cfg = recipe.evaluation.model_copy(update={"split": split})
    out = out or evaluation_folder(root, "model", {"model": model.identity, "records": records.name}, cfg)
    return out, run_evaluation(records, model.path, out, cfg, model_ref=model.label)
