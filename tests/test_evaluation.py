"""Evaluation end to end with the tiny LM."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embodied_r import schemas
from embodied_r.backends import BackendConfig
from embodied_r.evaluation import EvaluationConfig, run_evaluation
from embodied_r.io import ItemLog, partial_path
from embodied_r.records import RecordsConfig, run_records
from test_records import VIDEO, catalog_row, write_inputs


@pytest.fixture()
def records(tmp_path: Path) -> Path:
    rows = [catalog_row(f"urbanvideo:{i}", "test", answer="ABCD"[i % 4]) for i in range(4)]
    rows += [catalog_row("vsibench:9", "test", benchmark="vsibench", category="route_planning"),
             catalog_row("vsibench:10", "test", answer="2.5", answer_type="number", benchmark="vsibench",
                         category="object_abs_distance"),
             catalog_row("urbanvideo:20", "train")]
    catalog, perception = write_inputs(tmp_path, rows, {r["uid"]: VIDEO for r in rows})
    out = tmp_path / "records"
    run_records(catalog, perception, out, RecordsConfig())
    return out


def _cfg(**kw: object) -> EvaluationConfig:
    return EvaluationConfig(backend=BackendConfig(kind="transformers", device="cpu", batch_size=4),
                            max_new_tokens=12, chunk_size=4, **kw)


def test_evaluation_end_to_end(records: Path, tiny_lm_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    summary = run_evaluation(records, str(tiny_lm_path), out, _cfg())
    assert summary["items"] == 6 and summary["done"] == 6 and summary["failed"] == 0
    assert summary["count/overall"] == 6.0
    assert 0.0 <= summary["accuracy/overall"] <= 1.0
    for key in ("accuracy/macro", "accuracy/landmark_position", "accuracy/route_planning",
                "accuracy/object_abs_distance", "accuracy_by_benchmark/vsibench", "response_tokens/mean"):
        assert key in summary

    table = pq.read_table(out / "predictions.parquet")
    assert table.schema.equals(schemas.PREDICTIONS)
    preds = table.to_pylist()
    assert [p["uid"] for p in preds] == [f"urbanvideo:{i}" for i in range(4)] + ["vsibench:9", "vsibench:10"]
    assert all(0 < p["completion_tokens"] <= 12 for p in preds)
    # Random weights do not write "<answer>": unreadable answers are kept and score 0.
    assert all(p["score"] == 0.0 or p["prediction"] for p in preds)

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["metrics"]["count/overall"] == 6.0
    report = (out / "report.md").read_text()
    assert "| urbanvideo | Landmark Position | 4 |" in report and "55.1" in report
    assert "macro" in report

    # A finished stage is returned as is.
    assert run_evaluation(records, str(tiny_lm_path), out, _cfg()) == summary


def test_evaluation_resumes_after_a_crash(records: Path, tiny_lm_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    # An earlier attempt finished one question before it died.
    done = {"uid": "urbanvideo:2", "benchmark": "urbanvideo", "category": "Landmark Position", "solution": "C",
            "answer_type": "choice", "completion": "<think>ahead</think><answer>C</answer>", "prediction": "C",
            "score": 1.0, "completion_tokens": 9, "consistent": None}
    ItemLog(partial_path(out) / "items.jsonl", key="uid").append(done)
    summary = run_evaluation(records, str(tiny_lm_path), out, _cfg())
    assert summary["done"] == 6
    preds = {p["uid"]: p for p in pq.read_table(out / "predictions.parquet").to_pylist()}
    assert preds["urbanvideo:2"]["completion"] == done["completion"]  # not generated again
    assert summary["accuracy/overall"] >= 1 / 6


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_evaluation_records_unreachable_backend_as_failures(records: Path, tmp_path: Path) -> None:
    cfg = EvaluationConfig(backend=BackendConfig(kind="openai", base_url=f"http://127.0.0.1:{_closed_port()}/v1",
                                                 max_retries=0, timeout_s=5.0))
    out = tmp_path / "eval"
    summary = run_evaluation(records, "served-model", out, cfg)
    assert summary["done"] == 0 and summary["failed"] == 6
    assert summary["failure_reasons"] == {"generation_error": 6}
    assert len(pq.read_table(out / "failures.parquet")) == 6


def test_evaluation_missing_split_names_the_fix(records: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="convert"):
        run_evaluation(records, "tiny:lm", tmp_path / "eval", _cfg(split="holdout"))
