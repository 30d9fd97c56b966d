"""The convert stage: one GRPO record per catalog question with a perception text. The user
turn holds the video as text, the question with its options and an optional answer-format
instruction; ``question`` holds the question alone, for the consistency reference, which must
not see the video text."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from embodied_r import schemas
from embodied_r.benchmarks.base import ALL_SPLITS, OOD, question_block
from embodied_r.benchmarks.registry import evaluation_only
from embodied_r.io import (is_complete, item_done, read_summary, stage_folder, table_from_records, write_parquet_atomic,
                           write_summary)
from embodied_r.training.records_config import RecordsConfig
from embodied_r.scoring.answers import parse_choice, parse_number

# ``ood``: the evaluation-only benchmarks' questions, which no training stage reads.
SPLITS = ALL_SPLITS


def question_with_options(question: str, options: list[str] | None,
                          template: str = RecordsConfig.model_fields["question_template"].default) -> str:
    question = (question or "").strip()
    if not options:
        return question
    return question_block(template, question, options)


def solution_problem(row: dict[str, Any]) -> str | None:
    answer = str(row.get("answer") or "").strip()
    kind = row.get("answer_type")
    options = list(row.get("options") or [])
    if kind == "choice":
        if not options:
            return "choice_without_options"
        if parse_choice(answer, len(options)) != answer.upper() or len(answer) != 1:
            return "answer_not_an_option"
        return None
    if kind == "number":
        return None if parse_number(answer) is not None else "answer_not_a_number"
    return "unknown_answer_type"


def build_record(row: dict[str, Any], video_text: str, cfg: RecordsConfig) -> dict[str, Any]:
    options = [str(o) for o in (row.get("options") or [])]
    question = question_with_options(row["question"], options, cfg.question_template)
    instruction = cfg.number_instruction if row["answer_type"] == "number" else cfg.choice_instruction
    prompt = cfg.template.format(
        preamble=cfg.video_preamble,
        video_text=video_text.strip(),
        question=question,
        instruction=instruction,
    ).rstrip()  # no trailing line where the instruction is empty
    return {
        "uid": row["uid"],
        "benchmark": row["benchmark"],
        "category": row["category"],
        "split": row["split"],
        "system": cfg.system_prompt,
        "prompt": prompt,
        "question": question,
        "solution": str(row["answer"]).strip().upper() if row["answer_type"] == "choice" else str(row["answer"]).strip(),
        "answer_type": row["answer_type"],
        "options": options,
        "fact": row.get("fact") or "",
    }


def conversation(record: dict[str, Any]) -> list[dict[str, str]]:
    return [{"role": "system", "content": record["system"]}, {"role": "user", "content": record["prompt"]}]


def prompt_lengths(records: list[dict[str, Any]], tokenizer: str) -> list[int]:
    from embodied_r.training.policy import load_tokenizer, prompt_ids

    tok = load_tokenizer(tokenizer)
    return [len(prompt_ids(tok, conversation(record))) for record in records]


def _table_path(path: Path, default_name: str) -> Path:
    path = Path(path)
    return path / default_name if path.is_dir() else path


def run_records(catalog: Path, perception: Path, out: Path, cfg: RecordsConfig) -> dict[str, Any]:
    """``train/val/test/ood.parquet`` into ``out``; a question without a usable perception text
    or with an unscorable answer goes to ``failures.parquet``. ``catalog`` and ``perception``
    are the stage folders or their tables."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    catalog_file = _table_path(catalog, "catalog.parquet")
    perception_file = _table_path(perception, "perception.parquet")
    _check_inputs(catalog_file, perception_file, cfg)
    started = time.monotonic()
    rows = pq.read_table(catalog_file).to_pylist()
    texts = {str(p["uid"]): p["video_text"] or ""
             for p in pq.read_table(perception_file, columns=["uid", "video_text"]).to_pylist()}
    records, failures = _sort_rows(rows, texts, cfg)
    lengths = measure_prompts(records, failures, cfg)
    with stage_folder(out) as work:
        for split in SPLITS:
            write_parquet_atomic(table_from_records(records[split], schemas.RECORDS), work / f"{split}.parquet")
            item_done("convert")  # items, for a test's kill at a known point: the files written
        write_parquet_atomic(table_from_records(failures, schemas.RECORD_FAILURES), work / "failures.parquet")
        item_done("convert")
        summary = {**_counts(rows, records, failures), **lengths, "seconds": round(time.monotonic() - started, 3)}
        write_summary(work, summary)
    return summary


def _check_inputs(catalog_file: Path, perception_file: Path, cfg: RecordsConfig) -> None:
    for name, path, fix in (
        ("catalog", catalog_file, "run the preprocess stage first"),
        ("perception", perception_file, "run the perception stage first"),
    ):
        if not path.is_file():
            raise FileNotFoundError(f"records: {name} table {path} does not exist ({fix})")
    # Before any work, so a broken template fails at once, not per item.
    try:
        cfg.template.format(preamble="", video_text="", question="", instruction="")
    except (KeyError, IndexError) as exc:
        raise ValueError(
            f"records: template names an unknown field {exc}; use {{preamble}}, {{video_text}}, "
            "{question}, {instruction}"
        ) from exc


def _failure_reason(row: dict[str, Any], texts: dict[str, str]) -> str | None:
    uid = str(row["uid"])
    if uid not in texts:
        return "no_perception"
    if not texts[uid].strip():
        return "empty_video_text"
    if row.get("split") not in SPLITS:
        return "unknown_split"
    if evaluation_only(str(row.get("benchmark"))) != (row.get("split") == OOD):
        # A catalog made elsewhere must not slip a held-out question into training.
        return "split_against_benchmark_role"
    return solution_problem(row)


def _sort_rows(rows: list[dict[str, Any]], texts: dict[str, str], cfg: RecordsConfig,
               ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    # A pure, in-memory pass of about a second: redone whole after a crash, not logged per item.
    records: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    failures: list[dict[str, Any]] = []
    for row in rows:
        reason = _failure_reason(row, texts)
        if reason is not None:
            failures.append({"stage": "records", "item": str(row["uid"]), "reason": reason})
            continue
        records[row["split"]].append(build_record(row, texts[str(row["uid"])], cfg))
    return records, failures


def _counts(rows: list[dict[str, Any]], records: dict[str, list[dict[str, Any]]],
            failures: list[dict[str, Any]]) -> dict[str, Any]:
    done = sum(len(v) for v in records.values())
    all_records = [r for v in records.values() for r in v]
    return {
        "items": len(rows),
        "done": done,
        "failed": len(failures),
        "failure_reasons": dict(Counter(f["reason"] for f in failures)),
        "records_train": len(records["train"]),
        "records_val": len(records["val"]),
        "records_test": len(records["test"]),
        "records_ood": len(records[OOD]),
        "categories": dict(Counter(r["category"] for r in all_records)),
        "prompt_chars_mean": (sum(len(r["prompt"]) for r in all_records) / done) if done else 0.0,
    }


def measure_prompts(records: dict[str, list[dict[str, Any]]], failures: list[dict[str, Any]],
                    cfg: RecordsConfig) -> dict[str, Any]:
    """Summary fields; training records over ``cfg.max_prompt_tokens`` move to ``failures`` (in
    place). The others stay: dropping the longest questions would flatter evaluation's accuracy."""
    if cfg.tokenizer is None:
        return {}
    limit = cfg.max_prompt_tokens
    out: dict[str, Any] = {"prompt_tokenizer": cfg.tokenizer, "max_prompt_tokens": limit}
    every: list[int] = []
    for split in [s for s in SPLITS if s in records]:
        lengths = prompt_lengths(records[split], cfg.tokenizer)
        every += lengths
        if limit is None:
            continue
        over = [(r, n) for r, n in zip(records[split], lengths) if n > limit]
        if split == "train":
            failures += [{"stage": "records", "item": r["uid"], "reason": "prompt_too_long", "prompt_tokens": n}
                         for r, n in over]
            records[split] = [r for r, n in zip(records[split], lengths) if n <= limit]
            out["prompts_too_long"] = len(over)
        else:
            out[f"prompts_over_limit_{split}"] = len(over)
    out["prompt_tokens_max"] = max(every, default=0)
    out["prompt_tokens_mean"] = round(sum(every) / len(every), 1) if every else 0.0
    return out


def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    return run_records(Path(inputs["catalog"]), Path(inputs["perception"]), out,
                       RecordsConfig.model_validate(config))
