"""``embodied-r check gpu`` (``make gpu-check``): its table, its rows when there is no GPU,
its checks run on the CPU (``--device cpu``), and the whole of it where a GPU is present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from embodied_r.checks import gpu as gpu_check
from embodied_r.apps.cli import main

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.training.test_training_gpu" name="test_vllm_colocated_rollouts" time="0.01">
  <skipped type="pytest.skip" message="the training environment (/x/python) lacks vllm">skip</skipped></testcase>
<testcase classname="tests.backends.test_backends" name="test_transformers_on_gpu" time="3.20"/>
<testcase classname="tests.training.test_training_gpu" name="test_deepspeed_zero3_stage" time="1.50">
  <failure message="RuntimeError: CUDA error:&#10;device-side assert">trace</failure></testcase>
</testsuite></testsuites>"""


def test_gpu_tests_and_checks_make_one_table_and_a_closing_line(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(JUNIT)
    rows = gpu_check.rows_from_junit(report)
    assert [(r.name, r.status) for r in rows] == [
        ("tests/training/test_training_gpu.py::test_vllm_colocated_rollouts", "skipped"),
        ("tests/backends/test_backends.py::test_transformers_on_gpu", "passed"),
        ("tests/training/test_training_gpu.py::test_deepspeed_zero3_stage", "failed")]
    assert rows[0].detail == "the training environment (/x/python) lacks vllm"
    assert rows[2].detail == "RuntimeError: CUDA error: device-side assert"
    rows.append(gpu_check.Row("policy", gpu_check.CHECKS["policy"], "passed", "17.0 s/step after the first", 40.0))
    text = gpu_check.table(rows).splitlines()
    assert text[0].split() == ["check", "result", "seconds", "detail"]
    assert [line.split()[1] for line in text[1:]] == ["skipped", "ok", "FAILED", "ok"]
    assert text[4].split()[2] == "40.0" and text[4].endswith("17.0 s/step after the first")
    assert gpu_check.closing(rows) == "gpu-check: 2 passed, 1 failed"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is present: the check runs")
def test_without_a_gpu_every_row_says_so(capsys) -> None:
    assert main(["check", "gpu"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.split()[1:2] == ["skipped"]]
    assert {line.split()[0] for line in rows} == {"gpu-tests", *gpu_check.CHECKS}
    assert all("no GPU" in line for line in rows)
    assert out[-1] == "gpu-check: 0 passed, 0 failed"
    with pytest.raises(ValueError, match="unknown check"):
        gpu_check.run(only=["warp-drive"])


@pytest.mark.slow
def test_the_checks_run_on_the_cpu_each_in_its_own_process(tmp_path: Path, capsys) -> None:
    """The checks' machinery on the CPU: the backend, one step under ``accelerate launch``,
    and the policy step at the paper's trainer settings with the tiny LM's shape (short
    prompts and completions, so that it takes seconds); a check that fails is a failed row."""
    code = main(["check", "gpu", "--device", "cpu", "--no-tests", "--only", "backend", "accelerate", "policy",
                 "--policy-shape", "tiny", "--prompt-tokens", "120", "--completion-tokens", "8",
                 "--work", str(tmp_path / "work")])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] and line.split()[0] in gpu_check.CHECKS
            and line.split()[1:2] == ["ok"]}
    assert set(rows) == {"backend", "accelerate", "policy"}, out
    assert "tiny:lm on cpu in float32" in rows["backend"] and "tiny:vlm on cpu in float32" in rows["backend"]
    policy = rows["policy"]
    assert "8 generations, 32 completions per step" in policy and "completions cut at 8" in policy
    assert "s/step after the first (generation " in policy and ", update " in policy and "estimated about" in policy
    assert out.rstrip().endswith("gpu-check: 3 passed, 0 failed")
    for name in ("backend", "accelerate", "policy"):
        assert (tmp_path / "work" / name / "result.json").is_file()  # each ran as its own process

    # The GPU-marked tests through pytest's own report: here, each skipped with its reason.
    tests = gpu_check.run_gpu_tests(tmp_path)
    assert "tests/training/test_training_gpu.py::test_vllm_colocated_rollouts" in {r.name for r in tests}
    assert "tests/checks/test_gpu_check.py::test_gpu_check_whole" in {r.name for r in tests}
    assert all(r.status == "skipped" and r.detail for r in tests), tests

    assert main(["check", "gpu", "--device", "cpu", "--no-tests", "--only", "policy", "--recipe", "no-such-recipe",
                 "--work", str(tmp_path / "bad")]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "no-such-recipe" in out and out.rstrip().endswith("gpu-check: 0 passed, 1 failed")


@pytest.mark.gpu
def test_gpu_check_whole(capsys) -> None:
    """The whole ``make gpu-check`` where a GPU is present (not again from inside it)."""
    if os.environ.get(gpu_check.INSIDE):
        pytest.skip("run from inside gpu-check itself")
    code = main(["check", "gpu"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.rstrip().splitlines()[-1].startswith("gpu-check: ") and " 0 failed" in out


def test_one_tiny_step_config_serves_the_gpu_check_and_the_training_environment_check() -> None:
    """``check gpu`` and the training-environment check train the tiny models with one
    config: on the GPU it leaves precision to the GPU and asks the reference there; given a
    recipe it keeps the recipe's trainer settings and makes one small step on the CPU."""
    from embodied_r.checks.steps import tiny_training
    from embodied_r.config import load_recipe

    gpu = tiny_training("cuda")
    assert (gpu.use_cpu, gpu.bf16, gpu.reference.device, gpu.policy) == (False, None, "auto", "tiny:lm")
    assert [s.name for s in gpu.stages] == ["stage1", "stage2", "stage3"] and gpu.max_steps_per_stage == 1
    single = load_recipe("single-gpu").training
    cpu = tiny_training("cpu", single, policy="tiny:vlm", python="/train/bin/python")
    assert (cpu.use_cpu, cpu.bf16, cpu.vllm, cpu.reference.device) == (True, False, None, "cpu")
    assert (cpu.lora, cpu.learning_rate, cpu.gradient_checkpointing) == (
        single.lora, single.learning_rate, single.gradient_checkpointing)
    assert (cpu.policy, cpu.python, cpu.num_generations, cpu.max_completion_length) == (
        "tiny:vlm", "/train/bin/python", 2, 16)


def test_the_consistency_reference_is_asked_once_and_a_failure_is_a_row(tiny_lm_path: Path) -> None:
    from embodied_r.checks.steps import ask_reference, timed_row, tiny_training

    reference = tiny_training("cpu").reference
    asked = ask_reference(reference)
    assert (asked["device"], asked["asked"], asked["problems"]) == ("cpu", 1.0, [])
    # Asked for the GPU ("auto") on a machine without one: the row says where it ran.
    if not __import__("torch").cuda.is_available():
        assert ask_reference(reference.model_copy(update={"device": "auto"}))["problems"] == [
            "the reference runs on cpu, not the GPU"]

    def broken() -> list[str]:
        raise RuntimeError("CUDA error: device-side assert")

    row = timed_row("smoke", "a step", 1, broken, lambda: ["train.log, last lines: ..."])
    assert not row["ok"] and row["problems"][0] == "RuntimeError: CUDA error: device-side assert"
    assert row["problems"][-1] == "train.log, last lines: ..." and row["seconds"] >= 0
