"""Evaluation: answer every record of a split with a model and score it, resuming per question.
Every question counts: a failed call scores 0 and is listed in ``failures.parquet``; an outage,
or more failures than ``max_failed_fraction``, stops the stage and leaves it to resume."""

from __future__ import annotations

import logging
import math
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Literal

import pyarrow.parquet as pq

from embodied_r import progress, schemas
from embodied_r.backends.base import Backend, BackendConfig, Conversation
from embodied_r.backends.factory import make_backend
from embodied_r.errors import InfraFailure, check_failed_fraction
from embodied_r.redaction import redact
from embodied_r.io import (ItemLog, is_complete, read_summary, stage_folder, table_from_records, text_key,
                           write_json_atomic, write_parquet_atomic, write_summary)
from embodied_r.scoring.answers import ChoiceParser
from embodied_r.scoring.metrics import aggregate, category_table, chance_levels, score_answer, subtask_of
from embodied_r.scoring.config import NumberParsing
from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.evaluation.learning import write_learning
from embodied_r.evaluation.report import write_report
from embodied_r.shards import SHARD_INPUT, Sharding, parse_selection, run_sharded, summed

# (work folder, records, metrics) -> summary figures: files an evaluation writes beside its report
ExtraFiles = Callable[[Path, list[dict[str, Any]], dict[str, float]], dict[str, Any]]


def _valid_row(row: dict[str, Any]) -> bool:
    score = row.get("score")
    return (isinstance(row.get("uid"), str) and isinstance(score, (int, float)) and math.isfinite(score)
            and isinstance(row.get("completion"), str) and isinstance(row.get("prediction"), (str, type(None))))


def _question(record: dict[str, Any]) -> dict[str, Any]:
    options = list(record.get("options") or [])
    return {"uid": record["uid"], "benchmark": record["benchmark"], "category": record["category"],
            "subtask": subtask_of(record["category"], options), "solution": record["solution"],
            "answer_type": record["answer_type"]}


def failed_row(record: dict[str, Any]) -> dict[str, Any]:
    """A question whose call failed scores 0 and stays in the denominator."""
    return {**_question(record), "completion": "", "prediction": "", "score": 0.0, "completion_tokens": 0,
            "consistent": None}


def question_set(uids: Any) -> str:
    return text_key("\n".join(sorted(str(u) for u in uids)))


def _conversation(record: dict[str, Any]) -> Conversation:
    return [{"role": "system", "content": record["system"]}, {"role": "user", "content": record["prompt"]}]


def score_row(record: dict[str, Any], text: str, completion_tokens: int, number_parsing: NumberParsing = "official",
              answer_from: Literal["tag", "reply"] = "tag", choice_parser: ChoiceParser = "strict") -> dict[str, Any]:
    """``answer_from="reply"`` reads a reply without an ``<answer>`` block as the answer itself
    (models asked to answer directly)."""
    scored_text = text
    if answer_from == "reply" and "<answer>" not in (text or ""):
        scored_text = f"<answer>{text}</answer>"
    options = list(record.get("options") or [])
    prediction, score = score_answer(scored_text, record["solution"], record["answer_type"],
                                     len(options) or None, number_parsing=number_parsing,
                                     choice_parser=choice_parser)
    return {**_question(record), "completion": text, "prediction": prediction, "score": float(score),
            "completion_tokens": int(completion_tokens)}


def _judge(judge: Backend, records: list[dict[str, Any]], texts: list[str]) -> list[bool | None]:
    from embodied_r.scoring.rewards import consistency_ratio

    return consistency_ratio(judge, texts, [r["question"] for r in records], [r["answer_type"] for r in records],
                             [r.get("options") or None for r in records])[1]


def resolve_model_ref(model: str) -> str:
    """A local folder (or hub id) for a registry URI, an ``hf://`` hub folder or ``tiny:*``."""
    if not model:
        from embodied_r.evaluation.registry import CHAMPION_URI

        raise ValueError("evaluation: no model given; pass a checkpoint folder, a hub id, tiny:lm "
                         f"or a registry URI such as {CHAMPION_URI}")
    if model.startswith("models:/"):
        from embodied_r.evaluation.registry import resolve_model_uri

        return resolve_model_uri(model)
    if model.startswith("hf://"):
        from embodied_r.evaluation.released import fetch_hub_folder

        return fetch_hub_folder(model)
    from embodied_r.backends.models import resolve_model

    return resolve_model(model)


TABLE_FILE = "predictions_table.json"


def _video_text(record: dict[str, Any]) -> str:
    """The perception text: what comes before the question in a reasoning prompt."""
    prompt, question = str(record.get("prompt") or ""), str(record.get("question") or "")
    head = prompt.split(question.split("\n", 1)[0], 1)[0] if question else prompt
    return head.strip()[:4000]


def write_predictions_table(path: Path, records: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """One row per question for MLflow's table view (pandas "split" layout)."""
    by_uid = {r["uid"]: r for r in records}
    columns = ["uid", "task", "question", "perception", "completion", "prediction", "solution", "score"]
    data = [[row["uid"], row["category"], by_uid[row["uid"]].get("question", ""),
             _video_text(by_uid[row["uid"]]), row["completion"], row["prediction"], row["solution"], row["score"]]
            for row in rows if row["uid"] in by_uid]
    path.write_text(json.dumps({"columns": columns, "data": data}), encoding="utf-8")


def describe_model(path: str) -> str:
    """A pipeline stage's output named by its stage, else the path as given."""
    match = re.search(r"stages/(?P<stage>[^/]+)/(?P<key>[0-9a-f]{8,})/model/?$", path)
    return f"the model trained by {match['stage']} (output {match['key'][:8]})" if match else path


def read_split(records: Path, split: str) -> list[dict[str, Any]]:
    split_file = Path(records) / f"{split}.parquet"
    if not split_file.is_file():
        raise FileNotFoundError(f"evaluation: {split_file} does not exist (run the convert stage first)")
    return pq.read_table(split_file).to_pylist()


def _work(work: Path, records: list[dict[str, Any]], backend_cfg: BackendConfig, cfg: EvaluationConfig,
          conversation: Callable[[dict[str, Any]], Conversation], answer_from: Literal["tag", "reply"]
          ) -> dict[str, Any]:
    """Answer every record missing from ``work``'s item log, logging each as it is scored."""
    log = ItemLog(work / "items.jsonl", key="uid", validate=_valid_row)
    done = log.done_ids()
    pending = [r for r in records if r["uid"] not in done]
    progress.keep(len(done))
    failures: list[dict[str, str]] = []
    backend = make_backend(backend_cfg) if pending else None
    judge = make_backend(cfg.consistency_judge) if (pending and cfg.consistency_judge is not None) else None
    try:
        for start in range(0, len(pending), cfg.chunk_size):
            chunk = pending[start : start + cfg.chunk_size]
            assert backend is not None
            generations = backend.generate([conversation(r) for r in chunk])
            ok = [(r, g) for r, g in zip(chunk, generations) if not g.error]
            cut = {r["uid"]: (g.prompt_truncated, g.truncated) for r, g in zip(chunk, generations)}
            failures += [{"stage": "evaluate", "item": r["uid"], "reason": f"generation_error: {redact(g.error)}"}
                         for r, g in zip(chunk, generations) if g.error]
            outage = next((g.error for g in generations if g.infra_failed), None)
            verdicts: list[bool | None] = [None] * len(ok)
            if judge is not None and ok:
                verdicts = _judge(judge, [r for r, _ in ok], [g.text for _, g in ok])
            for (record, generation), verdict in zip(ok, verdicts):
                row = score_row(record, generation.text, generation.completion_tokens,
                                cfg.number_parsing, answer_from, cfg.choice_parser())
                row["consistent"] = verdict
                row["prompt_truncated"], row["reply_truncated"] = cut[record["uid"]]
                log.append(row)
            progress.update("evaluate", len(done) + start + len(chunk), len(records))
            if outage is not None:
                raise InfraFailure(
                    f"evaluate stopped: the model's server failed ({redact(outage)[:400]}). Answers so far "
                    "are kept; run again once it answers, and only the missing questions are asked")
    finally:
        for b in (backend, judge):
            if b is not None:
                b.close()
    return {"failures": failures, "pending": len(pending), "done": len(done) + len(pending) - len(failures),
            "failed": len(failures)}


def _finish(work: Path, all_records: list[dict[str, Any]], cfg: EvaluationConfig, run: dict[str, Any], *,
            model_label: str, title: str, extra_summary: dict[str, Any] | None,
            extra_files: ExtraFiles | None) -> dict[str, Any]:
    answered, rows, failures = _rows(work, all_records, run["failures"])
    check_failed_fraction("evaluation", len(failures), len(all_records), cfg.max_failed_fraction,
                          "see failures.parquet")
    write_parquet_atomic(table_from_records(rows, schemas.PREDICTIONS), work / "predictions.parquet")
    write_parquet_atomic(table_from_records(failures, schemas.FAILURES), work / "failures.parquet")
    metrics = _metrics(rows)
    categories = category_table(rows)
    chance = chance_levels(all_records)
    write_json_atomic(work / "metrics.json", {"metrics": metrics, "categories": categories, "chance": chance})
    write_report(work, categories, metrics, model=model_label, split=cfg.split, title=title, chance=chance,
                 prompts=cfg.prompts)
    write_predictions_table(work / TABLE_FILE, all_records, rows)
    if extra_files is not None:
        extra_summary = {**(extra_summary or {}), **extra_files(work, all_records, metrics)}
    seconds, pending = run["seconds"], run["pending"]
    summary: dict[str, Any] = {
        "model": model_label, "model_label": model_label, "prompts": cfg.prompts, "split": cfg.split,
        "items": len(all_records), "done": len(answered), "failed": len(failures),
        "failure_reasons": dict(Counter(f["reason"].split(":", 1)[0] for f in failures)),
        # Which questions were answered: promotion compares two models only when equal.
        "question_set": question_set(answered),
        "prompts_truncated": sum(1 for r in answered.values() if r.get("prompt_truncated")),
        "replies_truncated": sum(1 for r in answered.values() if r.get("reply_truncated")),
        "seconds": round(seconds, 3), "seconds_per_item": round(seconds / pending, 4) if pending else None,
        **(extra_summary or {}), **metrics}
    _log_truncated(summary, len(all_records), cfg)
    return summary


def _rows(work: Path, all_records: list[dict[str, Any]], failures: list[dict[str, str]]
          ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]], list[dict[str, str]]]:
    """(answered by uid, every question's row, every failure in the split's order)."""
    order = {r["uid"]: i for i, r in enumerate(all_records)}
    answered = {r["uid"]: r for r in ItemLog(work / "items.jsonl", key="uid", validate=_valid_row).read()
                if r["uid"] in order}
    # Unanswered questions are failures scoring 0: the accuracy's denominator is the whole split.
    rows = [answered.get(r["uid"]) or failed_row(r) for r in all_records]
    failures = sorted(failures, key=lambda f: order.get(f["item"], len(order)))
    listed = {f["item"] for f in failures}
    failures += [{"stage": "evaluate", "item": r["uid"], "reason": "generation_error: no answer"}
                 for r in all_records if r["uid"] not in answered and r["uid"] not in listed]
    return answered, rows, failures


def _metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    metrics = aggregate(rows)
    judged = [r["consistent"] for r in rows if r.get("consistent") is not None]
    if judged:
        metrics["consistency/ratio"] = sum(judged) / len(judged)
        metrics["consistency/judged"] = float(len(judged))
    return metrics


def _log_truncated(summary: dict[str, Any], items: int, cfg: EvaluationConfig) -> None:
    log = logging.getLogger(__name__)
    if summary["prompts_truncated"]:
        # The limit the recipe sets, as training cut the same prompts: said, not warned of.
        log.info("evaluation: %d of %d prompts read from their end (max_prompt_length=%s, as in training)",
                 summary["prompts_truncated"], items, cfg.max_prompt_length)
    if summary["replies_truncated"]:
        log.warning("evaluation: %d of %d replies were cut to max_new_tokens", summary["replies_truncated"], items)


def evaluate_records(all_records: list[dict[str, Any]], out: Path, backend_cfg: BackendConfig, cfg: EvaluationConfig,
                     *, model_label: str, conversation: Callable[[dict[str, Any]], Conversation] = _conversation,
                     answer_from: Literal["tag", "reply"] = "tag", title: str = "Evaluation",
                     extra_summary: dict[str, Any] | None = None, extra_files: ExtraFiles | None = None,
                     shard: int | None = None) -> dict[str, Any]:
    """With ``cfg.shards`` above 1, answered in shards (or only ``shard``, 0-based) and merged."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    labels = {"model_label": model_label, "title": title, "extra_summary": extra_summary,
              "extra_files": extra_files}
    if cfg.shards > 1:
        by_uid = {r["uid"]: r for r in all_records}

        def finish(work: Path, shards: list[dict[str, Any]]) -> dict[str, Any]:
            run = {"failures": [f for s in shards for f in s["failures"]],
                   **summed(shards, ("pending", "seconds"))}
            return _finish(work, all_records, cfg, run, **labels)

        return run_sharded(out, cfg.shards, Sharding(
            ids=list(by_uid), finish=finish, log_key="uid",
            work=lambda work, mine: _work(work, [by_uid[u] for u in mine], backend_cfg.pin(shard), cfg,
                                          conversation, answer_from)), shard)
    started = time.monotonic()
    with stage_folder(out) as work:
        run = _work(work, all_records, backend_cfg, cfg, conversation, answer_from)
        summary = _finish(work, all_records, cfg, {**run, "seconds": time.monotonic() - started}, **labels)
        write_summary(work, summary)
    return summary


def run_evaluation(records: Path, model: str, out: Path, cfg: EvaluationConfig, title: str = "Evaluation",
                   model_ref: str | None = None, extra_files: ExtraFiles | None = None,
                   shard: int | None = None) -> dict[str, Any]:
    """``model_ref`` names the model in the report when ``model`` is a folder it was resolved to."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    all_records = read_split(records, cfg.split)
    resolved = resolve_model_ref(model)
    ref = model_ref or (model if model != resolved else None)
    return evaluate_records(all_records, out, cfg.answering_backend(resolved), cfg,
                            model_label=ref or describe_model(resolved), title=title,
                            # The summary keeps the folder evaluated; the label is for people.
                            extra_summary={"model": resolved, **({"model_ref": ref} if ref else {})},
                            extra_files=extra_files, shard=shard)


def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    """With the learning figures when the plan hands it the baselines' and training stages' folders."""
    extra = None
    if inputs.get("baselines"):
        baselines, training = json.loads(inputs["baselines"]), json.loads(inputs.get("training") or "{}")

        def extra(work: Path, records: list[dict[str, Any]], metrics: dict[str, float]) -> dict[str, Any]:
            return write_learning(work, records, metrics, baselines, training)

    cfg = EvaluationConfig.model_validate(config)
    return run_evaluation(Path(inputs["records"]), inputs["model"], out, cfg, extra_files=extra,
                          shard=parse_selection(inputs.get(SHARD_INPUT), cfg.shards))
