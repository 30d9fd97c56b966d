"""The embodied-reasoner recipes and stage graph, the SFT labels, and the whole demo
pipeline end to end (slow: the demo's tiny VLM learns in three SFT stages and is evaluated)."""

from __future__ import annotations

import json

import pytest

from embodied_r.interactive.config import SFT_STAGES
from embodied_r.config import load_reasoner as load
from embodied_r.pipeline import plan
from embodied_r.interactive.sft_data import assistant_spans, labels_for, supervised_turns
from embodied_r.interactive.prompts import FEEDBACK


def test_recipes_load_and_plan_six_stages(tmp_path):
    paper = load("reasoner-paper")
    assert paper.sft.learning_rate == 1e-5 and paper.sft.max_pixels == 180000 and paper.sft.freeze_vision
    assert paper.backend.temperature == 0.6 and paper.evaluate.environment == "ai2thor"
    # The original server's sampling, every value set: none left to a library default.
    b = paper.backend
    assert (b.temperature, b.top_k, b.repetition_penalty, b.max_new_tokens) == (0.6, 10, 1.1, 1024)
    stages = plan(load("reasoner-demo"), tmp_path)
    assert list(stages) == ["reasoner_data", "reasoner_sft_imitation", "reasoner_explore",
                            "reasoner_sft_exploration", "reasoner_sft_correction", "reasoner_evaluate"]
    assert stages["reasoner_sft_exploration"].inputs["init_model"].startswith(stages["reasoner_sft_imitation"].out)
    changed = plan(load("reasoner-demo", {"evaluate": {"limit": 3}}), tmp_path)
    assert [n for n in stages if stages[n].key != changed[n].key] == ["reasoner_evaluate"]
    assert len(SFT_STAGES) == 3


def test_loss_on_assistant_turns_after_the_first_feedback_only():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "wrong"}, {"role": "user", "content": FEEDBACK + "no"},
            {"role": "assistant", "content": "fixed"}, {"role": "user", "content": FEEDBACK + "again"},
            {"role": "assistant", "content": "done"}]
    assert supervised_turns(msgs) == [False, True, True]
    assert supervised_turns([m for m in msgs if FEEDBACK not in m["content"]]) == [True, True, True]
    start, end = [7, 8], 9
    ids = [1, 2, 7, 8, 50, 51, 9, 3, 7, 8, 60, 9, 4, 7, 8, 70, 9]
    assert assistant_spans(ids, start, end) == [(4, 7), (10, 12), (15, 17)]
    labels = labels_for(ids, msgs, start, end)
    assert [x for x in labels if x != -100] == [60, 9, 70, 9]


@pytest.mark.slow
@pytest.mark.e2e
def test_reasoner_demo_end_to_end(tmp_path, monkeypatch, capsys):
    """The demo at seed 42, every stage through the CLI: each SFT stage learns its own data
    (token accuracy rises, first to last quarter of its steps), the stage-1 model's rollouts
    feed stage 2, and the trained agent succeeds where ending at once never does."""
    from mlflow import MlflowClient

    from embodied_r.apps.cli import main

    monkeypatch.setenv("EMBODIED_R_HOME", str(tmp_path))
    assert main(["reasoner", "--recipe", "reasoner-demo", "--seed", "42"]) == 0
    out = capsys.readouterr().out
    # Each SFT stage prints one compact line per logged step, never the trainer's raw dicts.
    for stage in ("reasoner_sft_imitation", "reasoner_sft_exploration", "reasoner_sft_correction"):
        steps = [line.split() for line in out.splitlines() if line.split()[:2] == [stage, "step"]]
        assert steps and all(w[3] == "loss" and float(w[4]) >= 0 for w in steps), out
        assert steps[-1][2].split("/")[0] == steps[-1][2].split("/")[1], steps[-1]
        sft = json.loads(next((tmp_path / "stages" / stage).glob("*/summary.json")).read_text())
        acc = sft["token_accuracy"]
        assert acc["last"] > acc["first"] + 0.05 and acc["last"] > 0.5, (stage, acc)
        assert f"token accuracy {acc['first']:.3f} -> {acc['last']:.3f}" in out
    assert "{'loss'" not in out and "'train_runtime'" not in out, out
    explore = json.loads(next((tmp_path / "stages" / "reasoner_explore").glob("*/summary.json")).read_text())
    assert explore["rollouts_kept"] >= 1  # their views are read by the exploration stage
    evaluation = json.loads(next((tmp_path / "stages" / "reasoner_evaluate").glob("*/summary.json")).read_text())
    assert evaluation["episodes"] == 33
    assert evaluation["metrics"]["success/all"] > evaluation["reference"]["free"]["success"] == 0
    assert evaluation["reference"]["ceiling"]["success"] == 1
    assert "scripted ceiling" in out and "free point (end at once)" in out
    assert "the SFT stages taught it to act at this seed." in out
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("embodied-reasoner")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    children = {r.data.tags["stage"] for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert children == {"reasoner_data", "reasoner_sft_imitation", "reasoner_explore", "reasoner_sft_exploration",
                        "reasoner_sft_correction", "reasoner_evaluate"}
    for metric in ("success", "efficiency", "completeness", "completeness_ordered", "repeat_rate"):
        for group in ("search", "manipulation", "transport", "composite"):
            assert f"{metric}/{group}" in parent.data.metrics
    # The original's success by number of key actions, and the dropped count (0 under the
    # demo's score_as_failure), beside them.
    assert any(k.startswith("success/key_actions/") for k in parent.data.metrics)
    assert parent.data.metrics["dropped"] == 0 and evaluation["failed_generation"] == "score_as_failure"
