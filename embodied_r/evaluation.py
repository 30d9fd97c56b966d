"""Evaluation: answer every record of a split with a checkpoint and score it.

Generation goes through the shared backends (in process, an OpenAI-compatible server,
or vLLM). Progress is logged per question, so an interrupted evaluation resumes where it
stopped. A question whose generation failed (the backend's error, after its retries) is
recorded as a failure and left out of the accuracy; an answer that cannot be parsed is
a wrong answer and counts.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from embodied_r import schemas
from embodied_r.backends import Backend, BackendConfig, make_backend
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
from embodied_r.metrics import aggregate, category_table, score_answer

# Embodied-R's accuracy (%) in the paper's Table 1, by the catalog's category names.
PAPER_ACCURACY = {
    "Landmark Position": 55.1,
    "Counterfactual": 59.9,
    "Progress Evaluation": 39.7,
    "Action Generation": 47.6,
    "object_rel_distance": 50.0,
    "object_rel_direction": 44.3,
    "route_planning": 36.8,
    "obj_appearance_order": 72.0,
}
PAPER_AVERAGE = 51.1


def _greedy_backend() -> BackendConfig:
    return BackendConfig(temperature=0.0, max_new_tokens=2048)


class EvaluationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Greedy decoding; ``model`` is filled in with the checkpoint folder by the pipeline.
    backend: BackendConfig = Field(default_factory=_greedy_backend)
    split: str = "test"
    # None keeps the backend's own limit.
    max_new_tokens: int | None = Field(None, ge=1)
    # When set, the share of answers a reference model reproduces from the reasoning alone
    # (the paper's "logically consistent" share) is measured too.
    reference: BackendConfig | None = None
    # Questions per generate call, and so between progress records.
    chunk_size: int = Field(32, ge=1)


def _conversation(record: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": "system", "content": record["system"]}, {"role": "user", "content": record["prompt"]}]


def _score(record: dict[str, Any], text: str, completion_tokens: int) -> dict[str, Any]:
    prediction, score = score_answer(text, record["solution"], record["answer_type"],
                                     len(record.get("options") or []) or None)
    return {
        "uid": record["uid"],
        "benchmark": record["benchmark"],
        "category": record["category"],
        "solution": record["solution"],
        "answer_type": record["answer_type"],
        "completion": text,
        "prediction": prediction,
        "score": float(score),
        "completion_tokens": int(completion_tokens),
    }


def render_report(rows: list[dict[str, Any]], metrics: dict[str, float], model: str, split: str) -> str:
    """A Markdown report: accuracy per category with counts, beside the paper's figures."""
    lines = [
        "# Evaluation",
        "",
        f"- model: `{model}`",
        f"- split: `{split}`, {len(rows)} questions",
        f"- answers that could be read: {100 * metrics.get('parsed/overall', 0.0):.1f} %",
    ]
    if "consistency/ratio" in metrics:
        lines.append(f"- logically consistent answers: {100 * metrics['consistency/ratio']:.1f} %")
    lines += [
        "",
        "| benchmark | category | questions | accuracy % | paper (Embodied-R) % |",
        "|---|---|---:|---:|---:|",
    ]
    for row in category_table(rows):
        paper = PAPER_ACCURACY.get(row["category"])
        paper_text = f"{paper:.1f}" if paper is not None else ""
        lines.append(
            f"| {row['benchmark']} | {row['category']} | {row['count']} | {100 * row['accuracy']:.1f} | {paper_text} |"
        )
    if rows:
        lines.append(
            f"| all | overall (micro) | {len(rows)} | {100 * metrics['accuracy/overall']:.1f} | |"
        )
        lines.append(
            f"| all | average over categories (macro) | {len(rows)} | "
            f"{100 * metrics['accuracy/macro']:.1f} | {PAPER_AVERAGE:.1f} |"
        )
    lines += [
        "",
        "Choice questions score 1 or 0; numeric ones VSI-Bench's mean relative accuracy. "
        "Unreadable answers count as wrong. The paper's column is its Table 1 (72B perceiver, "
        "3B reasoner); figures from the tiny demo models only prove the plumbing.",
        "",
    ]
    return "\n".join(lines)


def _consistency(reference: Backend, records: list[dict[str, Any]], texts: list[str]) -> list[bool | None]:
    from embodied_r.rewards import consistency_ratio

    _, verdicts = consistency_ratio(
        reference, texts, [r["question"] for r in records], [r["answer_type"] for r in records],
        [r.get("options") or None for r in records],
    )
    return verdicts


def run_evaluation(records: Path, model: str, out: Path, cfg: EvaluationConfig) -> dict[str, Any]:
    """Answer and score every record of ``cfg.split``; write predictions, metrics and a report."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    from embodied_r.tiny_models import resolve_model

    split_file = Path(records) / f"{cfg.split}.parquet"
    if not split_file.is_file():
        raise FileNotFoundError(f"evaluation: {split_file} does not exist (run the convert stage first)")
    if not model:
        raise ValueError("evaluation: no model given; pass a checkpoint folder, a hub id or tiny:lm")
    model = resolve_model(model)
    update: dict[str, Any] = {"model": model}
    if cfg.max_new_tokens is not None:
        update["max_new_tokens"] = cfg.max_new_tokens
    backend_cfg = cfg.backend.model_copy(update=update)
    all_records = pq.read_table(split_file).to_pylist()
    started = time.monotonic()

    with stage_folder(out) as work:
        log = ItemLog(work / "items.jsonl", key="uid")
        done = log.done_ids()
        pending = [r for r in all_records if r["uid"] not in done]
        failures: list[dict[str, str]] = []
        backend = make_backend(backend_cfg) if pending else None
        reference = make_backend(cfg.reference) if (pending and cfg.reference is not None) else None
        try:
            for start in range(0, len(pending), cfg.chunk_size):
                chunk = pending[start : start + cfg.chunk_size]
                assert backend is not None
                generations = backend.generate([_conversation(r) for r in chunk])
                ok = [(r, g) for r, g in zip(chunk, generations) if not g.error]
                failures += [
                    {"stage": "evaluate", "item": r["uid"], "reason": f"generation_error: {g.error}"}
                    for r, g in zip(chunk, generations) if g.error
                ]
                verdicts: list[bool | None] = [None] * len(ok)
                if reference is not None and ok:
                    verdicts = _consistency(reference, [r for r, _ in ok], [g.text for _, g in ok])
                for (record, generation), verdict in zip(ok, verdicts):
                    row = _score(record, generation.text, generation.completion_tokens)
                    row["consistent"] = verdict
                    log.append(row)
        finally:
            for b in (backend, reference):
                if b is not None:
                    b.close()

        wanted = {r["uid"] for r in all_records}
        rows = [r for r in log.read() if r["uid"] in wanted]
        order = {r["uid"]: i for i, r in enumerate(all_records)}
        rows.sort(key=lambda r: order[r["uid"]])
        write_parquet_atomic(table_from_records(rows, schemas.PREDICTIONS), work / "predictions.parquet")
        write_parquet_atomic(table_from_records(failures, schemas.FAILURES), work / "failures.parquet")

        metrics = aggregate(rows)
        judged = [r["consistent"] for r in rows if r.get("consistent") is not None]
        if judged:
            metrics["consistency/ratio"] = sum(judged) / len(judged)
            metrics["consistency/judged"] = float(len(judged))
        write_json_atomic(work / "metrics.json", {"metrics": metrics, "categories": category_table(rows)})
        (work / "report.md").write_text(render_report(rows, metrics, model, cfg.split), encoding="utf-8")
        seconds = time.monotonic() - started
        summary: dict[str, Any] = {
            "model": model,
            "split": cfg.split,
            "items": len(all_records),
            "done": len(rows),
            "failed": len(failures),
            "failure_reasons": dict(Counter(f["reason"].split(":", 1)[0] for f in failures)),
            "seconds": round(seconds, 3),
            "seconds_per_item": round(seconds / len(pending), 4) if pending else None,
            **metrics,
        }
        write_summary(work, summary)
    return summary
