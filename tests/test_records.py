"""GRPO records from a catalog and perception texts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from embodied_r import schemas
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.training.records import RecordsConfig, build_record, run_records

OPTIONS = ["A. left", "B. right", "C. ahead", "D. behind"]


def catalog_row(uid: str, split: str = "train", answer: str = "C", answer_type: str = "choice",
                category: str = "Landmark Position", benchmark: str = "urbanvideo") -> dict[str, Any]:
    return {
        "uid": uid, "benchmark": benchmark, "original_id": uid.split(":")[-1], "video_id": "v1",
        "video_path": "/data/v1.mp4", "scene": "s1", "category": category,
        "question": f"Where is the red door? ({uid})",
        "options": OPTIONS if answer_type == "choice" else [],
        "answer": answer, "answer_type": answer_type, "split": split, "fold": 0,
    }


def write_inputs(tmp: Path, rows: list[dict[str, Any]], texts: dict[str, str]) -> tuple[Path, Path]:
    catalog = tmp / "catalog" / "catalog.parquet"
    write_parquet_atomic(table_from_records(rows, schemas.CATALOG), catalog)
    perception = tmp / "perception"
    prows = [{"uid": u, "video_text": t, "n_frames": 2, "n_calls": 2, "prompt_tokens": 10, "completion_tokens": 5}
             for u, t in texts.items()]
    write_parquet_atomic(table_from_records(prows, schemas.PERCEPTION), perception / "perception.parquet")
    return catalog, perception


VIDEO = "Frame 0: Observe: a street.\nFrame 1: After move forward, Observe: a red door ahead."


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
    assert rec["system"].endswith("maintaining logical coherence between the two sections. User: . Assistant:")
    assert "<think> reasoning process here </think> \n<answer> answer here </answer>" in rec["system"]
    # This project's instruction stays an option.
    assert "<answer>" in build_record(catalog_row("urbanvideo:1"), VIDEO, RecordsConfig())["prompt"]
