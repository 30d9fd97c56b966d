"""The SFT baseline on the GRPO records (the paper's Table 1 sets RL against SFT): from the
policy's own prompt, the target ``<think>{think}</think><answer>{solution}</answer>``, the
answer supervised in the output format and a fixed neutral ``think`` that does not give it away
(the benchmarks hold no reasoning to imitate). Trained in the SFT child both pipelines share."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from embodied_r.io import (is_complete, read_summary, stage_folder, write_parquet_atomic,
                           write_summary)
from embodied_r.training.config import DEFAULT_THINK, SFTConfig
from embodied_r.training.records import conversation
from embodied_r.training.sft_child import SFTData
from embodied_r.training.sft_run import check_sft_disk, sft_in_child
from embodied_r.training.stage import check_inputs, local_model


def sft_target(record: dict[str, Any], think: str = DEFAULT_THINK) -> str:
    return f"<think>{think}</think><answer>{record['solution']}</answer>"


def sft_examples(records: list[dict[str, Any]], think: str) -> list[dict[str, Any]]:
    """Prompt/completion pairs: a record's own ``target`` (the warm start's traces), else the
    fixed-think one."""
    return [{"uid": r["uid"], "prompt": conversation(r),
             "completion": [{"role": "assistant", "content": r.get("target") or sft_target(r, think)}]}
            for r in records]


def cut_prompts(examples: list[dict[str, Any]], tokenizer: Any, max_prompt_length: int) -> list[dict[str, Any]]:
    """Prompts cut to their last ``max_prompt_length`` tokens, as GRPO and evaluation cut them.
    A cut prompt is chat-templated text, so every completion becomes text too."""
    from embodied_r.backends.truncation import limit_prompts

    cut = [dict(e) for e in examples]  # limit_prompts rewrites rows in place
    if not limit_prompts(cut, tokenizer, max_prompt_length).cut:
        return examples
    return [{**e, "completion": e["completion"][0]["content"]} for e in cut]


def split_by_length(examples: list[dict[str, Any]], tokenizer: Any, max_length: int
                    ) -> tuple[list[dict[str, Any]], list[str]]:
    """The examples that fit ``max_length`` tokens, and the uids of those that do not."""
    kept, too_long = [], []
    for example in examples:
        if isinstance(example["prompt"], str):  # cut prompts: templated text
            ids = tokenizer(example["prompt"] + example["completion"], add_special_tokens=False)
        else:
            ids = tokenizer.apply_chat_template(example["prompt"] + example["completion"], tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding in recent transformers
            ids = ids["input_ids"]
        if len(ids) <= max_length:
            kept.append(example)
        else:
            too_long.append(example["uid"])
    return kept, too_long


def record_examples(spec: dict[str, Any]) -> SFTData:
    """The SFT child's hook for Embodied-R: loss on the completion only."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from embodied_r.training.grpo import read_records

    cfg = SFTConfig.model_validate(spec["sft"])
    tokenizer = AutoTokenizer.from_pretrained(spec["init_model"])
    examples = sft_examples(read_records(Path(spec["records"])), cfg.think)
    if cfg.max_prompt_length is not None:
        examples = cut_prompts(examples, tokenizer, cfg.max_prompt_length)
    examples, too_long = split_by_length(examples, tokenizer, cfg.max_length)
    dataset = Dataset.from_list([{k: e[k] for k in ("prompt", "completion")} for e in examples])
    return SFTData(cfg, dataset, tokenizer, too_long, dataset_args={"completion_only_loss": True})


def run_sft(records: Path, init_model: str, out: Path, cfg: SFTConfig,
            mlflow_run_id: str | None = None, tracking_uri: str | None = None,
            traces: list[dict[str, Any]] | None = None, stage: str = "sft") -> dict[str, Any]:
    """Fine-tune ``init_model`` on ``records/train.parquet``, or on ``traces`` (records with a
    ``target``, kept in ``out/traces``), into ``out/model``; ``stage`` names the step lines."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    init_model = local_model(init_model)
    check_inputs(records, init_model, stage="sft")
    check_sft_disk(out, init_model, cfg, pq.read_metadata(Path(records) / "train.parquet").num_rows, "SFT")
    started = time.monotonic()
    with stage_folder(out) as work:
        if traces is not None:
            records = work / "traces"
            records.mkdir(exist_ok=True)
            write_parquet_atomic(pa.Table.from_pylist(traces), records / "train.parquet")
        # SFT's own fields only: a subclass (the warm start's config) adds trace settings.
        spec = {"examples": "embodied_r.training.sft:record_examples", "records": str(Path(records).resolve()),
                "init_model": init_model, "sft": cfg.model_dump(mode="json", include=set(SFTConfig.model_fields))}
        result = sft_in_child(work, spec, cfg, stage, "SFT", mlflow_run_id, tracking_uri)
        summary = {"stage": "sft", "init_model": init_model, "model": str(out / "model"),
                   "parent_seconds": round(time.monotonic() - started, 3), **result}
        write_summary(work, summary)
    return summary
