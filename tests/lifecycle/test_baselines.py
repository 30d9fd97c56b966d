"""The paper's baselines through the evaluation code: untrained reasoner, VLM on key frames."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq
import pytest
from PIL import Image

from embodied_r import schemas
from embodied_r.backends.base import BackendConfig
from embodied_r.lifecycle.baselines import (
    VLM_CHOICE,
    VLM_NUMBER,
    plan_baselines,
    run_baselines,
    run_policy_baseline,
    run_vlm_baseline,
    vlm_conversation,
)
from embodied_r.config import load_recipe
from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.pipeline import plan
from embodied_r.errors import StageError
from embodied_r.training.records import run_records
from embodied_r.training.records_config import RecordsConfig
from tests.servers import ScriptedModels
from tests.stage_inputs import VIDEO, catalog_row, write_inputs


@pytest.fixture()
def inputs(tmp_path: Path) -> dict[str, Path]:
    """Records, a catalog and a key-frame folder: v1 has three key frames, v2 none."""
    rows = [catalog_row(f"urbanvideo:{i}", "test", answer="ABCD"[i]) for i in range(3)]
    rows.append({**catalog_row("vsibench:7", "test", answer="2.5", answer_type="number", benchmark="vsibench",
                               category="object_abs_distance")})
    rows.append({**catalog_row("urbanvideo:9", "test"), "video_id": "v2"})
    catalog, perception = write_inputs(tmp_path, rows, {r["uid"]: VIDEO for r in rows})
    records = tmp_path / "records"
    run_records(catalog, perception, records, RecordsConfig())
    keyframes = tmp_path / "keyframes"
    (keyframes / "frames").mkdir(parents=True)
    kf_rows = []
    for rank in range(3):
        name = f"frames/v1_{rank}.jpg"
        Image.new("RGB", (64, 48), (60 * rank, 90, 200 - 50 * rank)).save(keyframes / name)
        kf_rows.append({"video_id": "v1", "rank": rank, "frame_index": 30 * rank, "timestamp": float(rank),
                        "overlap": 0.3, "reason": "low_overlap", "image_path": name})
    write_parquet_atomic(table_from_records(kf_rows, schemas.KEYFRAMES), keyframes / "keyframes.parquet")
    return {"records": records, "catalog": catalog, "keyframes": keyframes}


def test_vlm_conversation_shows_frames_then_asks_directly() -> None:
    record = {"question": "Where is it?\nOptions:\nA. here\nB. there", "answer_type": "choice"}
    conv = vlm_conversation(record, ["/f/0.jpg", "/f/1.jpg"])
    parts = conv[0]["content"]
    assert [p["type"] for p in parts] == ["image", "image", "text"]
    assert [p["path"] for p in parts[:2]] == ["/f/0.jpg", "/f/1.jpg"]
    assert parts[2]["text"].endswith(f"B. there\n{VLM_CHOICE}")
    assert vlm_conversation({**record, "answer_type": "number"}, [])[0]["content"][-1]["text"].endswith(VLM_NUMBER)


@pytest.fixture()
def direct_vlm() -> Iterator[ScriptedModels]:
    """A VLM that answers directly, without tags: "B." for choices, "2.5" for numbers."""

    def reply(model: str, messages: list[dict[str, Any]]) -> str:
        text = messages[-1]["content"][-1]["text"]
        return "2.5" if VLM_NUMBER in text else "B."

    server = ScriptedModels(reply)
    yield server
    server.stop()


def test_vlm_baseline_reads_direct_replies(inputs: dict[str, Path], direct_vlm: ScriptedModels,
                                           tmp_path: Path) -> None:
    cfg = EvaluationConfig(consistency_judge=direct_vlm.backend("judge"))
    out = tmp_path / "vlm"
    summary = run_vlm_baseline(inputs["records"], inputs["catalog"], inputs["keyframes"], out,
                               direct_vlm.backend("vlm"), cfg)
    assert summary["items"] == 4 and summary["without_key_frames"] == 1  # v2 has no key frames
    assert summary["accuracy/landmark_position"] == pytest.approx(1 / 3)  # "B." is right once in A, B, C
    assert summary["accuracy/object_abs_distance"] == 1.0
    assert summary["parsed/overall"] == 1.0
    assert "consistency/ratio" not in summary  # direct replies carry no reasoning to judge
    assert {r["model"] for r in direct_vlm.requests} == {"vlm"}
    first = direct_vlm.requests[0]["messages"][0]["content"]
    assert [p["type"] for p in first] == ["image_url"] * 3 + ["text"]  # the key frames, in order
    preds = {p["uid"]: p for p in pq.read_table(out / "predictions.parquet").to_pylist()}
    assert preds["urbanvideo:1"]["prediction"] == "B" and preds["urbanvideo:1"]["completion"] == "B."
    assert "Baseline: VLM on the key frames" in (out / "report.md").read_text()


def test_vlm_baseline_on_the_tiny_vlm(inputs: dict[str, Path], tiny_vlm_path: Path, tmp_path: Path) -> None:
    vlm = BackendConfig(kind="transformers", model=str(tiny_vlm_path), device="cpu", batch_size=4,
                        max_pixels=112 * 112)
    cfg = EvaluationConfig(backend=BackendConfig(kind="transformers", temperature=0.0, max_new_tokens=6))
    summary = run_vlm_baseline(inputs["records"], inputs["catalog"], inputs["keyframes"], tmp_path / "vlm", vlm,
                               cfg, max_images=2)
    assert summary["done"] == 3 + 1 and summary["failed"] == 0
    assert all(0 < p["completion_tokens"] <= 6 for p in pq.read_table(tmp_path / "vlm" / "predictions.parquet")
               .to_pylist())


def test_policy_baseline_is_an_evaluation_of_the_initial_model(inputs: dict[str, Path], tiny_lm_path: Path,
                                                                tmp_path: Path) -> None:
    cfg = EvaluationConfig(backend=BackendConfig(kind="transformers", device="cpu"), max_new_tokens=6)
    summary = run_policy_baseline(inputs["records"], "tiny:lm", tmp_path / "policy", cfg)
    assert summary["done"] == 5 and summary["model"] == str(tiny_lm_path)
    assert re.search(r"# Baseline: untrained reasoning model", (tmp_path / "policy" / "report.md").read_text())


def test_baselines_of_a_recipe_need_its_stages(tmp_path: Path) -> None:
    recipe = load_recipe("smoke")
    stages = plan(recipe, tmp_path)
    plans = plan_baselines(recipe, stages)
    assert set(plans) == {"policy", "vlm"} and plans["policy"].out != plans["vlm"].out
    assert plans == plan_baselines(recipe, plan(recipe, tmp_path))  # named by inputs, config and code: stable
    assert plans["policy"].inputs["policy"] == "tiny:lm"
    changed = load_recipe("smoke", {"evaluation": {"max_new_tokens": 7}})
    other = plan_baselines(changed, plan(changed, tmp_path))
    assert other["policy"].out != plans["policy"].out
    with pytest.raises(StageError, match="embodied-r convert --recipe smoke"):
        run_baselines(recipe, stages, only=["policy"])
    with pytest.raises(ValueError, match="unknown baseline"):
        run_baselines(recipe, stages, only=["oracle"])
