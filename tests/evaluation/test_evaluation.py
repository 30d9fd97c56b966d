"""Evaluation end to end with the tiny LM."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq
import pytest

from embodied_r import progress, schemas
from embodied_r.backends.base import BackendConfig
from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.evaluation.stage import run_evaluation
from embodied_r.io import ItemLog, partial_path
from embodied_r.training.records import run_records
from embodied_r.training.records_config import RecordsConfig
from embodied_r.evaluation.report import REPORT_FILES, table_rows_from_folder
from tests.stage_inputs import VIDEO, build_records, catalog_row, write_inputs
from tests.servers import ChatStub, ScriptedModels, StubReply, completion, free_port, text_of

@pytest.fixture()
def records(tmp_path: Path) -> Path:
    rows = [catalog_row(f"urbanvideo:{i}", "test", answer="ABCD"[i % 4]) for i in range(4)]
    rows += [catalog_row("vsibench:9", "test", benchmark="vsibench", category="route_planning"),
             catalog_row("vsibench:10", "test", answer="2.5", answer_type="number", benchmark="vsibench",
                         category="object_abs_distance"),
             catalog_row("urbanvideo:20", "train")]
    return build_records(tmp_path, rows)


def _cfg(**kw: object) -> EvaluationConfig:
    return EvaluationConfig(backend=BackendConfig(kind="transformers", device="cpu", batch_size=4),
                            max_new_tokens=12, chunk_size=4, **kw)


def test_evaluation_end_to_end(records: Path, tiny_lm_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    summary = run_evaluation(records, str(tiny_lm_path), out, _cfg())
    assert summary["items"] == 6 and summary["done"] == 6 and summary["failed"] == 0
    assert summary["count/overall"] == 6.0
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
    # The figures are the per-question scores' means, every question counted once.
    scores = {p["uid"]: p["score"] for p in preds}
    landmark = sum(scores[f"urbanvideo:{i}"] for i in range(4)) / 4
    assert summary["accuracy/overall"] == pytest.approx(sum(scores.values()) / 6)
    assert summary["accuracy/landmark_position"] == pytest.approx(landmark)
    assert summary["accuracy/route_planning"] == scores["vsibench:9"]

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["metrics"]["count/overall"] == 6.0
    report = (out / "report.md").read_text()
    # This model's figure beside the paper's, on the task's own row.
    assert re.search(rf"\| urbanvideo \| Landmark Position ⚠? \| 4 \| {100 * landmark:.1f} \| [^|]* \| [^|]* \| 55\.1 \|",
                     report), report
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
    progress.begin("evaluate")
    summary = run_evaluation(records, str(tiny_lm_path), out, _cfg())
    assert summary["done"] == 6
    assert progress.kept() == 1  # said on the stage's done line
    preds = {p["uid"]: p for p in pq.read_table(out / "predictions.parquet").to_pylist()}
    assert preds["urbanvideo:2"]["completion"] == done["completion"]  # not generated again
    assert summary["accuracy/overall"] >= 1 / 6


def test_evaluation_stops_on_an_unreachable_backend_and_stays_partial(records: Path, tmp_path: Path) -> None:
    # An outage is not six wrong answers: the stage stops, nothing is cached as done.
    from embodied_r.errors import InfraFailure

    cfg = EvaluationConfig(backend=BackendConfig(kind="openai", base_url=f"http://127.0.0.1:{free_port()}/v1",
                                                 max_retries=0, timeout_s=5.0))
    out = tmp_path / "eval"
    with pytest.raises(InfraFailure, match="Cannot connect"):
        run_evaluation(records, "served-model", out, cfg)
    assert not out.exists() and (tmp_path / "eval.partial").is_dir()


def test_evaluation_missing_split_names_the_fix(records: Path, tmp_path: Path) -> None:
    (records / "val.parquet").unlink()
    with pytest.raises(FileNotFoundError, match="convert"):
        run_evaluation(records, "tiny:lm", tmp_path / "eval", _cfg(split="val"))


def test_evaluation_split_is_one_of_the_three() -> None:
    with pytest.raises(ValueError, match="holdout|literal"):
        _cfg(split="holdout")


# -- scoring end to end, against models whose answers are known --------------------------

TWO, THREE, FOUR = ["A. left", "B. right"], ["A. left", "B. right", "C. back"], \
    ["A. front-left", "B. front-right", "C. back-left", "D. back-right"]

# uid -> (answer, options, what the model writes); the judge answers what JUDGE= names.
SCRIPT = {
    "urbanvideo:0": ("A", None, "<think>JUDGE=A</think><answer>A</answer>"),  # right, consistent
    "urbanvideo:1": ("B", None, "<think>JUDGE=C</think><answer>B</answer>"),  # right, inconsistent
    "urbanvideo:2": ("C", None, "<think>JUDGE=A</think><answer>A</answer>"),  # wrong, consistent
    "urbanvideo:3": ("D", None, "I think it is D."),  # no answer block: wrong, not judged
    "vsibench:1": ("A", TWO, "<answer>A</answer>"),  # easy, right, no reasoning to judge
    "vsibench:2": ("B", TWO, "<think>JUDGE=B</think><answer>B</answer>"),  # easy, right, consistent
    "vsibench:3": ("C", THREE, "<think>JUDGE=C</think><answer>A</answer>"),  # medium, wrong, inconsistent
    "vsibench:4": ("D", FOUR, "<think>JUDGE=D</think><answer>D</answer>"),  # hard, right, consistent
    "vsibench:5": ("2.5", [], "<think>JUDGE=2.6</think><answer>2.6 m</answer>"),  # 4 % off: 1.0
    "vsibench:6": ("2.5", [], "<answer>about 2.5</answer>"),  # officially not a number: 0
}


def script_reply(model: str, messages: list[dict[str, Any]]) -> str:
    text = text_of(messages)
    if model == "judge":
        found = re.search(r"JUDGE=([\w.]+)", text)
        return found.group(1) if found else "?"
    uid = re.search(r"\((\w+:\d+)\)", text).group(1)
    return SCRIPT[uid][2]


@pytest.fixture()
def scripted_records(tmp_path: Path) -> Path:
    rows = []
    for uid, (answer, options, _) in SCRIPT.items():
        if uid.startswith("urbanvideo"):
            rows.append(catalog_row(uid, "test", answer=answer))
        elif options:
            row = catalog_row(uid, "test", answer=answer, benchmark="vsibench", category="object_rel_direction")
            rows.append({**row, "options": options})
        else:
            rows.append(catalog_row(uid, "test", answer=answer, answer_type="number", benchmark="vsibench",
                                    category="object_abs_distance"))
    return build_records(tmp_path, rows)


def test_scores_as_the_benchmarks_do_with_a_judge(scripted: ScriptedModels, scripted_records: Path,
                                                  tmp_path: Path) -> None:
    cfg = EvaluationConfig(backend=scripted.backend("policy"), consistency_judge=scripted.backend("judge"))
    out = tmp_path / "eval"
    m = run_evaluation(scripted_records, "policy", out, cfg)
    assert m["done"] == 10 and m["failed"] == 0
    assert m["accuracy/landmark_position"] == pytest.approx(2 / 4)
    # Relative direction: easy 2/2, medium 0/1, hard 1/1 -> pooled 3/4 (the paper's way);
    # VSI-Bench's mean of the subtypes (1 + 0 + 1) / 3 apart.
    assert m["accuracy/object_rel_direction"] == pytest.approx(3 / 4)
    assert m["accuracy/object_rel_direction/subtype_mean"] == pytest.approx(2 / 3)
    assert m["accuracy/object_rel_direction/medium"] == 0.0
    assert m["accuracy/object_abs_distance"] == pytest.approx(0.5)  # 2.6 scores 1, "about 2.5" 0
    assert m["accuracy/overall"] == pytest.approx(6 / 10)
    assert m["accuracy/macro"] == pytest.approx((0.5 + 2 / 3 + 0.5) / 3)
    assert m["accuracy/paper_tasks"] == pytest.approx(5 / 8)
    assert m["parsed/overall"] == pytest.approx(8 / 10)
    # Judged: the seven answers with reasoning and a readable answer; five agree.
    assert m["consistency/judged"] == 7.0
    assert m["consistency/ratio"] == pytest.approx(5 / 7)
    judge_calls = [r for r in scripted.requests if r["model"] == "judge"]
    assert judge_calls and all("Frame 0" not in text_of(r["messages"]) for r in judge_calls)
    assert all(r["temperature"] == 0.0 for r in scripted.requests if r["model"] == "policy")

    preds = {p["uid"]: p for p in pq.read_table(out / "predictions.parquet").to_pylist()}
    assert preds["vsibench:6"]["prediction"] == "" and preds["vsibench:5"]["prediction"] == "2.6"
    for name in REPORT_FILES:
        assert (out / name).is_file()
    assert (out / "accuracy_by_task.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert re.search(r"\| vsibench \| Relative Direction ⚠? \| 4 \| 75\.0 \| [^|]* \| [^|]* \| 44\.3 \|", report)
    assert re.search(r"\| \| &nbsp;&nbsp;mean of the subtypes \(VSI-Bench's rule\) \| 4 \| 66\.7 \| \[[\d.]+, [\d.]+\] \| \| \|",
                     report)
    assert "logically consistent answers (judge model): 71.4 %" in report
    assert "| **this evaluation** | 62.5 | 50.0 |" in report
    rows = {r["task"]: r for r in table_rows_from_folder(out)}
    assert rows["Landmark Position"] == {"benchmark": "urbanvideo", "task": "Landmark Position", "questions": 4,
                                         "accuracy_pct": 50.0, "paper_pct": 55.1}
    assert rows["Absolute Distance"]["paper_pct"] is None


def test_lenient_number_parsing_is_a_choice(scripted: ScriptedModels, scripted_records: Path,
                                            tmp_path: Path) -> None:
    cfg = EvaluationConfig(backend=scripted.backend("policy"), number_parsing="lenient")
    m = run_evaluation(scripted_records, "policy", tmp_path / "eval", cfg)
    assert m["accuracy/object_abs_distance"] == pytest.approx(1.0)  # "about 2.5" read as 2.5
    assert "consistency/ratio" not in m


# -- mixed failures: 2 of 6 calls fail ----------------------------------------------------

# uid -> (answer, category, what the policy writes; FAIL: the call is refused)
MIXED = {
    "urbanvideo:0": ("A", "Landmark Position", "<think>x</think><answer>A</answer>"),  # right
    "urbanvideo:1": ("B", "Landmark Position", "FAIL"),
    "urbanvideo:2": ("C", "Landmark Position", "<think>x</think><answer>A</answer>"),  # wrong
    "urbanvideo:3": ("D", "Counterfactual", "<think>x</think><answer>D</answer>"),  # right
    "urbanvideo:4": ("A", "Counterfactual", "FAIL"),
    "urbanvideo:5": ("B", "Counterfactual", "<think>x</think><answer>B</answer>"),  # right
}


@pytest.fixture()
def mixed(tmp_path: Path) -> Iterator[tuple[ChatStub, Path]]:
    def reply(body: dict[str, Any]) -> StubReply:
        uid = re.search(r"\((\w+:\d+)\)", text_of(body["messages"])).group(1)
        text = MIXED[uid][2]
        if text == "FAIL":
            return StubReply(status=400, payload={"error": {"message": f"refused {uid}"}})
        return StubReply(payload=completion(body["model"], text))

    rows = [catalog_row(uid, "test", answer=answer, category=category) for uid, (answer, category, _) in MIXED.items()]
    catalog, perception = write_inputs(tmp_path, rows, {r["uid"]: VIDEO for r in rows})
    run_records(catalog, perception, tmp_path / "records", RecordsConfig())
    server = ChatStub(reply)
    yield server, tmp_path / "records"
    server.stop()


def _mixed_cfg(server: ChatStub) -> EvaluationConfig:
    return EvaluationConfig(backend=BackendConfig(kind="openai", model="policy", base_url=server.base_url,
                                                  max_retries=0, timeout_s=120.0, api_key_env="EMBODIED_R_TEST_KEY"),
                            chunk_size=4, max_failed_fraction=1.0)


def test_evaluation_with_two_of_six_calls_failing_records_both(mixed: tuple[ChatStub, Path],
                                                               tmp_path: Path) -> None:
    server, records = mixed
    out = tmp_path / "eval"
    m = run_evaluation(records, "policy", out, _mixed_cfg(server))
    assert len(server.bodies) == 6  # each question asked once: a refusal is not retried
    assert m["items"] == 6 and m["failed"] == 2
    assert m["failure_reasons"] == {"generation_error": 2}
    failures = pq.read_table(out / "failures.parquet").to_pylist()
    assert sorted(f["item"] for f in failures) == ["urbanvideo:1", "urbanvideo:4"]
    assert all(f["stage"] == "evaluate" and f["reason"].startswith("generation_error:") for f in failures)
    assert any("refused urbanvideo:1" in f["reason"] for f in failures)
    preds = {p["uid"]: p for p in pq.read_table(out / "predictions.parquet").to_pylist()}
    for uid in ("urbanvideo:0", "urbanvideo:3", "urbanvideo:5"):
        assert preds[uid]["score"] == 1.0
    assert preds["urbanvideo:2"]["score"] == 0.0 and preds["urbanvideo:2"]["prediction"] == "A"


def test_a_question_whose_call_failed_scores_zero_and_counts_as_failed(mixed: tuple[ChatStub, Path],
                                                                       tmp_path: Path) -> None:
    """Issue 15's rule: the denominator is every question asked, so a model whose calls
    fail cannot look better than one that answers them wrongly."""
    server, records = mixed
    m = run_evaluation(records, "policy", tmp_path / "eval", _mixed_cfg(server))
    assert m["failed"] == 2
    assert m["accuracy/overall"] == pytest.approx(3 / 6)
    assert m["accuracy/landmark_position"] == pytest.approx(1 / 3)
    assert m["accuracy/counterfactual"] == pytest.approx(2 / 3)
    assert m["count/overall"] == 6.0


# -- a real SIGKILL mid-evaluation, then a rerun -------------------------------------------


@pytest.mark.slow
def test_killed_evaluation_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    """The policy server answers two questions, then holds every further call until the
    test lets it go: the evaluation is SIGKILLed (its whole process group) at a point it is
    known to have reached, never in a race with its own end."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    gate = threading.Event()
    answered = []

    def reply(body: dict[str, Any]) -> StubReply:
        uid = re.search(r"\((\w+:\d+)\)", text_of(body["messages"])).group(1)
        if len(answered) >= 2 and not gate.is_set():
            gate.wait(300)
        answered.append(uid)
        return StubReply(payload=completion(body["model"], MIXED[uid][2].replace("FAIL", "<answer>C</answer>")))

    rows = [catalog_row(uid, "test", answer=answer, category=category) for uid, (answer, category, _) in MIXED.items()]
    catalog, perception = write_inputs(tmp_path, rows, {r["uid"]: VIDEO for r in rows})
    records = tmp_path / "records"
    run_records(catalog, perception, records, RecordsConfig())
    server = ChatStub(reply)
    try:
        cfg = EvaluationConfig(backend=BackendConfig(kind="openai", model="policy", base_url=server.base_url,
                                                     max_retries=0, timeout_s=600.0,
                                                     api_key_env="EMBODIED_R_TEST_KEY", concurrency=1),
                               chunk_size=1)
        out = tmp_path / "killed"
        code = ("from pathlib import Path\n"
                "from embodied_r.evaluation.stage import run_evaluation\n"
                "from embodied_r.evaluation.config import EvaluationConfig\n"
                f"run_evaluation(Path({str(records)!r}), 'policy', Path({str(out)!r}),\n"
                f"               EvaluationConfig.model_validate_json({cfg.model_dump_json()!r}))\n")
        root = Path(__file__).resolve().parents[2]
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        items = partial_path(out) / "items.jsonl"
        deadline = time.monotonic() + 300
        while not (items.is_file() and len(items.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        gate.set()
        assert not out.exists() and len(items.read_text().splitlines()) == 2

        asked_before = len(server.bodies)
        resumed = run_evaluation(records, "policy", out, cfg)
        assert len(server.bodies) - asked_before == 4  # only the four questions not yet answered
        whole = run_evaluation(records, "policy", tmp_path / "whole", cfg)
    finally:
        gate.set()
        server.stop()
    drop = ("seconds", "seconds_per_item")
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in whole.items() if k not in drop}
    assert pq.read_table(out / "predictions.parquet").equals(pq.read_table(tmp_path / "whole" / "predictions.parquet"))

def test_official_answer_reading_is_an_option() -> None:
    from embodied_r.evaluation.stage import score_row

    record = {"uid": "u", "benchmark": "urbanvideo", "category": "Landmark Position", "solution": "A",
              "answer_type": "choice", "options": ["A. left", "B. right"]}
    # The official scoring script reads the first letter after <answer>: "Based" gives B.
    text = "<think>It is on the left.</think><answer>Based on the frames, A</answer>"
    assert score_row(record, text, 5)["prediction"] == ""  # strict: a sentence, not one option
    assert score_row(record, text, 5, choice_parser="official_eval")["prediction"] == "B"
    assert EvaluationConfig(answer_parser="official").choice_parser() == "official_eval"
    assert EvaluationConfig().choice_parser() == "strict"
