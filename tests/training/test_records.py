"""GRPO records from a catalog and perception texts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embodied_r import schemas
from embodied_r.training.records import build_record, run_records
from embodied_r.training.records_config import RecordsConfig
from tests.stage_inputs import OPTIONS, VIDEO, catalog_row, write_inputs


def test_build_record_keeps_video_text_out_of_the_question() -> None:
    rec = build_record(catalog_row("urbanvideo:1"), VIDEO, RecordsConfig())
    assert set(rec) == set(schemas.RECORDS.names)
    assert VIDEO in rec["prompt"] and "Where is the red door?" in rec["prompt"]
    assert "C. ahead" in rec["prompt"] and "<think>" in rec["prompt"] and "<answer>" in rec["prompt"]
    assert "egocentric" in rec["prompt"]
    assert rec["question"] == "Where is the red door? (urbanvideo:1)\nOptions:\n" + "\n".join(OPTIONS)
    assert "Frame" not in rec["question"]
    assert "<think>" in rec["system"] and "<answer>" in rec["system"]
    assert rec["solution"] == "C" and rec["options"] == OPTIONS


def test_build_record_number() -> None:
    rec = build_record(catalog_row("vsibench:7", answer="2.5", answer_type="number"), VIDEO, RecordsConfig())
    assert rec["solution"] == "2.5" and rec["options"] == []
    assert "number" in rec["prompt"] and "Options" not in rec["question"]


def test_run_records_splits_and_reports_what_it_left_out(tmp_path: Path) -> None:
    rows = [
        catalog_row("urbanvideo:1", "train"),
        catalog_row("urbanvideo:2", "val"),
        catalog_row("vsibench:3", "test", benchmark="vsibench", category="route_planning"),
        catalog_row("urbanvideo:4", "train"),  # no perception
        catalog_row("urbanvideo:5", "train"),  # empty perception text
        catalog_row("urbanvideo:6", "train", answer="F"),  # answer is not an option
        catalog_row("vsibench:8", "test", answer="3", answer_type="number", category="object_counting"),
    ]
    texts = {r["uid"]: VIDEO for r in rows if r["uid"] not in {"urbanvideo:4", "urbanvideo:5"}}
    texts["urbanvideo:5"] = "  "
    catalog, perception = write_inputs(tmp_path, rows, texts)
    out = tmp_path / "records"
    summary = run_records(catalog, perception, out, RecordsConfig())

    assert summary["items"] == 7 and summary["done"] == 4 and summary["failed"] == 3
    assert summary["failure_reasons"] == {"no_perception": 1, "empty_video_text": 1, "answer_not_an_option": 1}
    assert (summary["records_train"], summary["records_val"], summary["records_test"]) == (1, 1, 2)
    for split in ("train", "val", "test"):
        table = pq.read_table(out / f"{split}.parquet")
        assert table.schema.equals(schemas.RECORDS)
        assert set(table.column("split").to_pylist()) <= {split}
    failures = pq.read_table(out / "failures.parquet").to_pylist()
    assert {f["item"] for f in failures} == {"urbanvideo:4", "urbanvideo:5", "urbanvideo:6"}
    assert json.loads((out / "summary.json").read_text())["done"] == 4

    # A finished stage is returned as is, even if its inputs vanish.
    catalog.unlink()
    assert run_records(catalog, perception, out, RecordsConfig()) == summary


def test_run_records_missing_input_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="perception"):
        catalog, _ = write_inputs(tmp_path, [catalog_row("urbanvideo:1")], {})
        run_records(catalog, tmp_path / "nowhere", tmp_path / "out", RecordsConfig())
    assert not (tmp_path / "out").exists()


def test_run_records_bad_template_fails_at_once(tmp_path: Path) -> None:
    catalog, perception = write_inputs(tmp_path, [catalog_row("urbanvideo:1")], {"urbanvideo:1": VIDEO})
    with pytest.raises(ValueError, match="unknown field"):
        run_records(catalog, perception, tmp_path / "out", RecordsConfig(template="{video} {question}"))


def test_config_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError):
        RecordsConfig(sytem_prompt="typo")


def test_the_paper_user_turn_has_no_format_instruction() -> None:
    from embodied_r.config import load_recipe

    cfg = load_recipe("paper").records
    rec = build_record(catalog_row("urbanvideo:1"), VIDEO, cfg)
    # The official user turn ends with the question and its choices; only the system prompt
    # asks for <think> and <answer>.
    assert rec["prompt"].endswith(rec["question"])
    assert "<think>" not in rec["prompt"] and "<answer>" not in rec["prompt"]
    assert rec["system"].endswith(" User: . Assistant:")
    assert "<think> the reasoning </think> \n<answer> the answer </answer>" in rec["system"]
    # This project's instruction stays an option.
    assert "<answer>" in build_record(catalog_row("urbanvideo:1"), VIDEO, RecordsConfig())["prompt"]


# -- what mutation testing found unchecked ------------------------------------------------


def test_solution_problems_are_named() -> None:
    from embodied_r.training.records import question_with_options, solution_problem

    assert solution_problem(catalog_row("u:1")) is None
    assert solution_problem({**catalog_row("u:1"), "options": []}) == "choice_without_options"
    assert solution_problem(catalog_row("u:1", answer="F")) == "answer_not_an_option"
    assert solution_problem(catalog_row("u:1", answer="3", answer_type="number")) is None
    assert solution_problem(catalog_row("u:1", answer="many", answer_type="number")) == "answer_not_a_number"
    assert solution_problem(catalog_row("u:1", answer_type="free")) == "unknown_answer_type"
    assert question_with_options(None, []) == ""


def test_records_carry_the_right_instruction_preamble_and_solution() -> None:
    from embodied_r.training.prompts import DEFAULT_CHOICE_INSTRUCTION, DEFAULT_NUMBER_INSTRUCTION, DEFAULT_VIDEO_PREAMBLE
    from embodied_r.training.records import conversation

    choice = build_record(catalog_row("u:1", answer=" c "), VIDEO, RecordsConfig())
    assert choice["solution"] == "C"
    assert DEFAULT_CHOICE_INSTRUCTION in choice["prompt"] and DEFAULT_NUMBER_INSTRUCTION not in choice["prompt"]
    assert DEFAULT_VIDEO_PREAMBLE in choice["prompt"]
    number = build_record(catalog_row("u:2", answer=" 1e3 ", answer_type="number"), VIDEO, RecordsConfig())
    assert number["solution"] == "1e3"  # as written, not upper-cased like a letter
    assert DEFAULT_NUMBER_INSTRUCTION in number["prompt"]
    assert conversation(choice) == [{"role": "system", "content": choice["system"]},
                                    {"role": "user", "content": choice["prompt"]}]


def test_run_records_reads_folders_and_names_every_reason(tmp_path: Path) -> None:
    from embodied_r.training.records import run_stage

    rows = [catalog_row("u:1", "train", category="A"), catalog_row("u:2", "val", category="B"),
            catalog_row("u:3", "holdout"), catalog_row("u:4", "test")]
    catalog, perception = write_inputs(tmp_path, rows, {"u:1": VIDEO, "u:2": VIDEO + " more", "u:3": VIDEO,
                                                        "u:4": None})
    # The stage folders, as the pipeline passes them.
    summary = run_stage(tmp_path / "out", {}, {"catalog": str(catalog.parent), "perception": str(perception)})
    assert summary["failure_reasons"] == {"unknown_split": 1, "empty_video_text": 1}
    assert pq.read_table(tmp_path / "out" / "failures.parquet").to_pylist() == [
        {"stage": "records", "item": "u:3", "reason": "unknown_split", "prompt_tokens": None},
        {"stage": "records", "item": "u:4", "reason": "empty_video_text", "prompt_tokens": None}]
    assert summary["categories"] == {"A": 1, "B": 1}
    prompts = [r["prompt"] for s in ("train", "val") for r in pq.read_table(tmp_path / "out" / f"{s}.parquet").to_pylist()]
    assert summary["prompt_chars_mean"] == sum(map(len, prompts)) / 2
    assert isinstance(summary["seconds"], float) and 0 <= summary["seconds"] <= time.monotonic()

    # Nothing usable: no records, and a mean of 0 rather than a division by zero.
    catalog, perception = write_inputs(tmp_path / "none", rows[:1], {})
    empty = run_records(catalog, perception, tmp_path / "none" / "out", RecordsConfig())
    assert empty["done"] == 0 and empty["prompt_chars_mean"] == 0.0


def test_missing_tables_and_bad_templates_name_the_fix(tmp_path: Path) -> None:
    catalog, perception = write_inputs(tmp_path, [catalog_row("u:1")], {"u:1": VIDEO})
    with pytest.raises(FileNotFoundError, match=r"^records: catalog table .*nowhere\.parquet does not exist "
                                                r"\(run the preprocess stage first\)$"):
        run_records(tmp_path / "nowhere.parquet", perception, tmp_path / "out", RecordsConfig())
    with pytest.raises(FileNotFoundError, match=r"^records: perception table .*nowhere does not "
                                                r"exist \(run the perception stage first\)$"):
        run_records(catalog, tmp_path / "nowhere", tmp_path / "out", RecordsConfig())
    with pytest.raises(ValueError, match=r"^records: template names an unknown field 'video'; use \{preamble\}, "
                                         r"\{video_text\}, \{question\}, \{instruction\}$"):
        run_records(catalog, perception, tmp_path / "out", RecordsConfig(template="{video}"))


def test_prompt_token_limit_is_what_vllm_leaves_for_the_prompt() -> None:
    from types import SimpleNamespace

    from embodied_r.training.records_config import prompt_token_limit

    assert prompt_token_limit(SimpleNamespace(max_completion_length=10)) is None  # no vLLM section at all
    assert prompt_token_limit(SimpleNamespace(vllm=SimpleNamespace(max_model_length=11),
                                              max_completion_length=10)) == 1
    with pytest.raises(ValueError, match="no room for a prompt"):
        prompt_token_limit(SimpleNamespace(vllm=SimpleNamespace(max_model_length=10), max_completion_length=10))


def test_prompts_are_measured_with_the_generation_prompt_in_every_split(tiny_lm_path: Path) -> None:
    from embodied_r.training.policy import load_tokenizer
    from embodied_r.training.records import conversation, measure_prompts, prompt_lengths

    tok = load_tokenizer(str(tiny_lm_path))
    records = {"train": [build_record(catalog_row("u:1"), VIDEO, RecordsConfig())],
               "val": [build_record(catalog_row("u:2", "val"), VIDEO + " a little more", RecordsConfig())],
               "test": [build_record(catalog_row("u:3", "test"), VIDEO + " and much more text" * 8, RecordsConfig())]}
    lengths = {s: prompt_lengths(r, str(tiny_lm_path))[0] for s, r in records.items()}
    for split, (record,) in records.items():
        text = tok.apply_chat_template(conversation(record), add_generation_prompt=True, tokenize=False)
        assert lengths[split] == len(tok(text, add_special_tokens=False)["input_ids"])
    assert sum(lengths.values()) % 3  # a mean with more than one decimal, to see its rounding

    out = measure_prompts({s: list(r) for s, r in records.items()}, [], RecordsConfig(tokenizer=str(tiny_lm_path)))
    assert out == {"prompt_tokenizer": str(tiny_lm_path), "max_prompt_tokens": None,
                   "prompt_tokens_max": lengths["test"],
                   "prompt_tokens_mean": round(sum(lengths.values()) / 3, 1)}
    assert isinstance(out["prompt_tokens_mean"], float)

    # A training prompt exactly at the limit is kept; one token over is not.
    for limit, kept in ((lengths["train"], 1), (lengths["train"] - 1, 0)):
        measured = {s: list(r) for s, r in records.items()}
        failures: list[dict] = []
        measure_prompts(measured, failures, RecordsConfig(tokenizer=str(tiny_lm_path), max_prompt_tokens=limit))
        assert len(measured["train"]) == kept and len(failures) == 1 - kept

    nothing = measure_prompts({s: [] for s in ("train", "val", "test")}, [], RecordsConfig(tokenizer=str(tiny_lm_path)))
    assert (nothing["prompt_tokens_max"], nothing["prompt_tokens_mean"]) == (0, 0.0)
