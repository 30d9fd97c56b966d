"""The SFT baseline on the CPU with the tiny LM: library stage, recipe baseline and command."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embodied_r.scoring.answers import FORMAT_RE, extract_answer
from embodied_r.config import load_recipe
from embodied_r.io import partial_path
from embodied_r.pipeline import plan
from embodied_r.errors import StageError
from embodied_r.lifecycle.sft_baseline import sft_config_for
from embodied_r.training.config import DEFAULT_THINK, SFTConfig
from embodied_r.training.sft import run_sft, sft_target
from embodied_r.training.config import TrainingConfig
from tests.stage_inputs import VIDEO, build_records, catalog_row

LONG_VIDEO = "\n".join(f"Frame {i}: After move forward, Observe: a street with buildings and trees."
                       for i in range(400))


def _records(folder: Path, tmp: Path, long_one: bool = False) -> Path:
    rows = [catalog_row(f"urbanvideo:{i}", "train", answer="ABCD"[i % 4]) for i in range(6)]
    rows += [catalog_row(f"urbanvideo:{i}", "test", answer="ABCD"[i % 4]) for i in range(6, 9)]
    texts = {r["uid"]: VIDEO for r in rows}
    if long_one:
        rows.append(catalog_row("urbanvideo:long", "train"))
        texts["urbanvideo:long"] = LONG_VIDEO
    return build_records(tmp, rows, texts, out=folder)


def tiny_sft(**kw: object) -> SFTConfig:
    base: dict[str, object] = dict(use_cpu=True, gradient_checkpointing=False, learning_rate=1e-3,
                                   per_device_train_batch_size=2, gradient_accumulation_steps=1,
                                   max_steps=3, max_length=1024, save_steps=2)
    base.update(kw)
    return SFTConfig(**base)


def test_target_is_in_the_output_format() -> None:
    target = sft_target({"solution": "C"})
    assert FORMAT_RE.match(target) and extract_answer(target) == "C"
    assert not re.search(r"\b[A-E]\b", DEFAULT_THINK)  # the reasoning line names no option
    assert sft_target({"solution": "2.5"}, think="t") == "<think>t</think><answer>2.5</answer>"


def test_config_follows_the_recipes_training_environment() -> None:
    demo = load_recipe("smoke")
    cfg = sft_config_for(demo, epochs=1.0)
    assert cfg.use_cpu and cfg.max_steps == demo.training.max_steps_per_stage and cfg.epochs == 1.0
    assert cfg.learning_rate == 1e-5  # SFT's own rate, not GRPO's
    single = sft_config_for(load_recipe("single-gpu"))
    assert single.lora is not None and single.launcher == "python"
    with pytest.raises(ValueError):
        SFTConfig(think="")
    with pytest.raises(ValueError):
        SFTConfig(learning_rat=1e-5)


def assert_compact_step_lines(out: str, stage: str, steps: int) -> None:
    """One ``stage  step k/n  loss ...  token acc ...  lr ...`` line per step, no raw log dict."""
    lines = [line for line in out.splitlines() if line.split()[:2] == [stage, "step"]]
    assert [line.split()[2] for line in lines] == [f"{k}/{steps}" for k in range(1, steps + 1)], out
    for line in lines:
        words = line.split()
        assert words[3] == "loss" and words[5:7] == ["token", "acc"] and words[8] == "lr", line
        assert all(float(words[i]) >= 0 for i in (4, 7, 9)), line  # numbers, not "-"
    assert "{'loss'" not in out and "'train_runtime'" not in out and "{" not in out, out
    assert "examples/s" not in out, out  # nor the dataset passes' bars before training


def test_run_sft_trains_saves_and_lists_too_long_records(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from transformers import AutoModelForCausalLM

    records = _records(tmp_path / "records", tmp_path, long_one=True)
    out = tmp_path / "sft"
    summary = run_sft(records, "tiny:lm", out, tiny_sft())
    assert_compact_step_lines(capsys.readouterr().out, "sft", 3)
    assert summary["steps"] == 3 and summary["steps_this_run"] == 3
    assert summary["seconds_per_step"] == pytest.approx(summary["seconds"] / 3, abs=1e-3)
    assert summary["done"] == 6 and summary["failed"] == 1 and summary["failure_reasons"] == {"too_long": 1}
    failures = pq.read_table(out / "failures.parquet").to_pylist()
    assert failures == [{"stage": "sft", "item": "urbanvideo:long", "reason": "too_long"}]
    assert summary["final_loss"] is not None and summary["final_loss"] < summary["first_loss"]
    AutoModelForCausalLM.from_pretrained(str(out / "model"))
    assert (out / "model" / "tokenizer.json").is_file() and not (out / "checkpoints").exists()
    assert json.loads((out / "summary.json").read_text()) == summary
    # Every argument by the name the installed libraries ask for: no deprecation in the log.
    log = out / "train.log"
    assert not re.search(r"(Future|Deprecation)Warning", log.read_text())
    # Done once: a second call returns the summary without training.
    before = log.stat().st_mtime_ns
    assert run_sft(records, "tiny:lm", out, tiny_sft()) == summary
    assert log.stat().st_mtime_ns == before


def test_warm_start_prints_its_own_step_lines(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from embodied_r.training.warmstart import run_warmstart
    from embodied_r.training.config import WarmstartConfig

    records = _records(tmp_path / "records", tmp_path)
    cfg = WarmstartConfig(**tiny_sft(max_steps=2).model_dump(include=set(SFTConfig.model_fields)))
    summary = run_warmstart(records, "tiny:lm", tmp_path / "warm", cfg)
    assert summary["stage"] == "warmstart" and summary["steps"] == 2
    assert_compact_step_lines(capsys.readouterr().out, "warmstart", 2)


def test_run_sft_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    records = _records(tmp_path / "records", tmp_path)
    out = tmp_path / "sft"
    run_sft(records, "tiny:lm", out, tiny_sft(max_steps=2, keep_checkpoints=True))
    partial = partial_path(out)
    out.rename(partial)  # as a kill after the step-2 checkpoint leaves it
    for name in ("summary.json", "train_result.json"):
        (partial / name).unlink()
    resumed = run_sft(records, "tiny:lm", out, tiny_sft(max_steps=3))
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 3 and resumed["steps_this_run"] == 1


def test_missing_records_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="convert"):
        run_sft(tmp_path / "none", "tiny:lm", tmp_path / "out", tiny_sft())


def test_sft_command_trains_evaluates_and_tracks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``embodied-r sft --recipe smoke`` on the smoke recipe's convert folder."""
    from mlflow import MlflowClient

    from embodied_r.apps import cli_train

    root = tmp_path / "home"
    monkeypatch.setenv("EMBODIED_R_HOME", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    parser = argparse.ArgumentParser(prog="embodied-r")
    cli_train.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sft", "--recipe", "smoke", "--max-steps", "2"])

    # Before the convert stage has run, the command says which command makes its input.
    with pytest.raises(StageError, match="embodied-r convert --recipe smoke"):
        args.handler(args)

    recipe = load_recipe("smoke")
    _records(Path(plan(recipe, root)["convert"].out), tmp_path)
    assert args.handler(args) == 0

    sft_dirs = [p for p in (root / "stages" / "sft").iterdir() if p.is_dir()]  # beside each: its lock file
    eval_dirs = [p for p in (root / "stages" / "sft_evaluate").iterdir() if p.is_dir()]
    assert len(sft_dirs) == 1 and len(eval_dirs) == 1
    sft_summary = json.loads((sft_dirs[0] / "summary.json").read_text())
    evaluation = json.loads((eval_dirs[0] / "summary.json").read_text())
    assert sft_summary["steps"] == 2
    assert evaluation["model"] == str(sft_dirs[0] / "model") and evaluation["items"] == 3
    assert (eval_dirs[0] / "predictions.parquet").is_file() and (eval_dirs[0] / "report.md").is_file()

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(recipe.tracking.experiment)
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert {"smoke-sft-baseline", "sft", "sft_evaluate"} <= set(runs)
    parent = runs["smoke-sft-baseline"].info.run_id
    for name in ("sft", "sft_evaluate"):
        assert runs[name].data.tags["mlflow.parentRunId"] == parent and runs[name].info.status == "FINISHED"
    assert "accuracy/overall" in runs["sft_evaluate"].data.metrics
    assert runs["smoke-sft-baseline"].data.metrics["accuracy/overall"] == evaluation["accuracy/overall"]
    assert "train/loss" in runs["sft"].data.metrics  # the trainer logged into the sft run
    assert runs["sft"].data.params["sft.learning_rate"] == "1e-05"
    assert runs["sft"].data.params["trainer.learning_rate"] == "1e-05"  # the trainer's own record

    # Run again: both folders are reused, nothing retrained.
    before = (sft_dirs[0] / "train.log").stat().st_mtime_ns
    assert args.handler(args) == 0
    assert (sft_dirs[0] / "train.log").stat().st_mtime_ns == before


def test_training_config_still_validates_with_sft_fields() -> None:
    # SFT shares the trainer environment with GRPO; GRPO's own checks are untouched.
    with pytest.raises(ValueError, match="divisible"):
        TrainingConfig(num_generations=8, per_device_train_batch_size=3, gradient_accumulation_steps=1)


def test_warm_start_stage_run_keeps_its_config_and_the_trainers_own_params(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm start's run keeps its name, the recipe's settings under ``warmstart.``, the
    trainer's own arguments under ``trainer.`` (MLflow refuses a param logged twice with two
    values: the recipe's bf16 None, the trainer's False), its per-step figures in chart groups
    and its summary as params."""
    from mlflow import MlflowClient

    from embodied_r.pipeline import StagePlan
    from embodied_r.stage_kinds import kind_of
    from embodied_r.stage_plan import Plan
    from embodied_r.tracking.record import Recorder
    from embodied_r.training.config import WarmstartConfig
    from tasks.stages import run_stage

    records = _records(tmp_path / "records", tmp_path)
    cfg = WarmstartConfig(**tiny_sft(max_steps=1).model_dump(include=set(SFTConfig.model_fields)))
    sp = StagePlan("warmstart", "warmstart", "key", str(tmp_path / "warm"), ("convert",),
                   {"records": str(records), "init_model": "tiny:lm", "python": ""},
                   cfg.model_dump(mode="json", exclude={"python"}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the store the trainer child reports to
    recorder = Recorder(Plan({sp.name: sp}, pipeline="embodied-r", root=tmp_path,
                             recipe={"name": "warm", "tracking": {"tracking_uri": uri, "experiment": "warm"}}), kind_of)
    recorder.run_started([sp.name], [])
    run_id = run_stage(sp.to_dict(), recorder)["mlflow_run_id"]
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    params = run.data.params
    assert params["warmstart.bf16"] == "None" and params["warmstart.max_steps"] == "1"
    # The trainer's own arguments under a prefix of their own, and the run keeps the stage's name.
    assert params["trainer.bf16"] == "False" and params["trainer.learning_rate"] == "0.001"
    assert run.info.run_name == "warmstart"
    assert {p.split(".", 1)[0] for p in params} == {"warmstart", "trainer", "summary"}, sorted(params)
    # Every figure in a chart group: the loss under train/, the stage summary as params.
    assert "train/loss" in run.data.metrics and {m.split("/", 1)[0] for m in run.data.metrics} <= {"train", "timing"}
    assert params["summary.steps"] == "1"


def test_prompts_are_cut_from_the_left_as_the_grpo_stages_cut_them(tiny_lm_path: Path) -> None:
    """With ``max_prompt_length`` the warm start is taught on the prompts' last tokens, as the
    GRPO stages and evaluation see them: the question and options stay, the first frames go,
    and the completion follows the templated prompt as text."""
    from transformers import AutoTokenizer

    from embodied_r.training.sft import cut_prompts

    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    frames = "\n".join(f"Frame {i}: After move forward, Observe: the red cube is on my left" for i in range(40))
    long = {"uid": "a", "prompt": [{"role": "system", "content": "S"},
                                   {"role": "user", "content": frames + "\nQuestion: where? Options: A. left"}],
            "completion": [{"role": "assistant", "content": "<think>x</think><answer>A</answer>"}]}
    short = {**long, "uid": "b", "prompt": [{"role": "user", "content": "Question: where?"}]}
    cut = cut_prompts([long, short], tok, 64)
    assert all(isinstance(e["prompt"], str) and e["completion"] == "<think>x</think><answer>A</answer>" for e in cut)
    assert len(tok(cut[0]["prompt"], add_special_tokens=False)["input_ids"]) <= 64
    assert cut[0]["prompt"].endswith("Options: A. left<|im_end|>\n<|im_start|>assistant\n")
    assert "Frame 0:" not in cut[0]["prompt"] and "Frame 39:" in cut[0]["prompt"]
    # Nothing too long: the examples stay conversational, as without a limit.
    assert cut_prompts([short], tok, 64) == [short]
