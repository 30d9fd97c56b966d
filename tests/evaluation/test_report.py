"""The evaluation report: Markdown, bar chart, Table 1 side by side, Prefect table rows."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from PIL import Image

from embodied_r.scoring.metrics import aggregate, category_table
from embodied_r.evaluation.report import (
    COLUMN_NAMES,
    PAPER_MODEL,
    PAPER_TABLE1,
    REPORT_FILES,
    comparison_rows,
    plot_accuracy,
    render_comparison,
    table_rows,
    write_report,
)


def _rows() -> list[dict]:
    def row(bench: str, cat: str, score: float, sub: str | None = None) -> dict:
        return {"benchmark": bench, "category": cat, "score": score, "subtask": sub, "prediction": "A",
                "completion": "<think>x</think><answer>A</answer>", "completion_tokens": 12}

    return [row("urbanvideo", "Landmark Position", 1.0), row("urbanvideo", "Landmark Position", 0.0),
            row("urbanvideo", "Counterfactual", 1.0),
            row("vsibench", "object_rel_direction", 1.0, "easy"), row("vsibench", "object_rel_direction", 0.0, "hard"),
            row("vsibench", "object_counting", 0.7)]


def test_table1_holds_the_papers_numbers() -> None:
    assert PAPER_TABLE1[PAPER_MODEL] == (51.1, 55.1, 59.9, 39.7, 47.6, 50.0, 44.3, 36.8, 72.0)
    assert all(len(v) == len(COLUMN_NAMES) == 9 for v in PAPER_TABLE1.values())
    assert PAPER_TABLE1["Random"][0] == 24.0 and PAPER_TABLE1["Qwen2.5-VL-72B"][6] == 29.0


def test_comparison_puts_this_run_beside_the_paper() -> None:
    metrics = aggregate(_rows())
    rows = comparison_rows({"trained": metrics, "empty": {}})
    assert [r["model"] for r in rows[:-2]] == list(PAPER_TABLE1)
    ours = rows[-2]
    assert ours["source"] == "this run"
    assert ours["LP"] == 50.0 and ours["CF"] == 100.0 and ours["RDir"] == 50.0
    assert ours["avg"] == pytest.approx(round(100 * 3 / 5, 1))  # paper tasks only, per question
    assert ours["PE"] is None and ours["AO"] is None
    assert all(rows[-1][c] is None for c in COLUMN_NAMES)
    text = render_comparison({"trained": metrics, "untrained": aggregate(_rows()[:2])}, split="test")
    assert "| **trained** | 60.0 | 50.0 | 100.0 |" in text
    assert "| **untrained** | 50.0 | 50.0 |  |" in text


def test_table_rows_for_a_prefect_artifact() -> None:
    rows = table_rows(category_table(_rows()))
    assert rows[0] == {"benchmark": "urbanvideo", "task": "Counterfactual", "questions": 1,
                       "accuracy_pct": 100.0, "paper_pct": 59.9}
    assert {r["task"]: r["paper_pct"] for r in rows}["Object Count"] is None
    assert all(set(r) == {"benchmark", "task", "questions", "accuracy_pct", "paper_pct"} for r in rows)


def test_write_report_files(tmp_path: Path) -> None:
    rows = _rows()
    metrics = aggregate(rows)
    metrics.update({"consistency/ratio": 0.5, "consistency/judged": 4.0})
    paths = write_report(tmp_path, category_table(rows), metrics, model="m", split="val",
                         others={"baseline": aggregate(rows[:3])})
    assert [p.name for p in paths] == list(REPORT_FILES)
    md = (tmp_path / "report.md").read_text()
    assert "- split: `val`, 6 questions" in md
    assert "logically consistent answers (judge model): 50.0 % of 4 judged" in md
    # Every accuracy has its 95 % interval beside it: tasks, subtypes, and the summary rows.
    assert "| | &nbsp;&nbsp;easy | 1 | 100.0 | [20.7, 100.0] | | |" in md
    assert "| urbanvideo | Landmark Position ⚠ | 2 | 50.0 | [9.5, 90.5] |" in md
    assert "| all | every question (micro) | 6 | 61.7 | [26.4, 87.8] | | |" in md
    for label in ("mean of the subtypes (VSI-Bench's rule)", "the paper's eight tasks (per question)",
                  "mean over tasks (macro)"):
        row = next(line for line in md.splitlines() if label in line)
        assert row.split("|")[5].strip().startswith("["), row
    # Every row of the per-task table has the header's seven cells.
    table = md.split("## Accuracy per task")[1].split("\n\n")[1].splitlines()
    assert {row.count("|") for row in table} == {8}
    assert "| **baseline** |" in md and "| **this evaluation** |" in md
    table = list(csv.DictReader(io.StringIO((tmp_path / "paper_comparison.csv").read_text())))
    assert [r["model"] for r in table[-2:]] == ["this evaluation", "baseline"]
    assert table[-2]["LP"] == "50.0" and table[-2]["PE"] == ""
    with Image.open(tmp_path / "accuracy_by_task.png") as img:
        assert img.format == "PNG" and img.size[0] > 300


def test_chart_of_nothing_still_draws(tmp_path: Path) -> None:
    path = plot_accuracy([], tmp_path / "empty.png")
    with Image.open(path) as img:
        assert img.format == "PNG"
