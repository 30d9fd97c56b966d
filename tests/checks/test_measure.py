"""``embodied-r check gpu --measure`` on a CPU, on the tiny LM's shape: every batch and length
asked for is timed, and the projection printed and written is the one ``checks.projection``
makes from the figures measured (decode at a step's batch, update at the longest length)."""

from __future__ import annotations

import json

import pytest

from embodied_r.checks import projection
from embodied_r.checks.measure import STEP_BATCH, Measured


def test_measure_on_a_cpu_times_every_batch_and_length_and_projects_from_them(tmp_path, capsys):
    from embodied_r.apps.cli import main

    out = tmp_path / "measure.json"
    args = ["check", "gpu", "--measure", "--device", "cpu", "--policy-shape", "tiny", "--recipe", "smoke",
            "--batches", "4", "32", "--lengths", "16", "48", "--decode-tokens", "6", "--micro-batch", "2",
            "--prompt-tokens", "24", "--train-prompts", "1171", "--val-prompts", "64", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert set(data["decode_ms"]) == {"4", "32"} and set(data["update_tokens_per_s"]) == {"16", "48"}
    assert all(isinstance(v, float) and v >= 0 for v in (data["decode_ms"]["32"]["dynamic"],))
    assert all(v > 0 for v in data["update_tokens_per_s"].values()) and data["optimizer_step_s"] > 0
    assert data["peak_gib"] is None and "peak memory: not measured on a CPU" in printed
    # The projection is checks.projection's, from the figures the command says it used.
    measured = Measured(**{k: data[k] for k in ("device", "shape", "prompt_tokens", "decode_tokens", "micro_batch",
                                                "decode_ms", "update_tokens_per_s", "optimizer_step_s")})
    figures = measured.figures()
    step = data["decode_ms"]["32"]
    assert figures.decode_ms_per_step == min(v for v in step.values() if isinstance(v, float))
    assert figures.update_tokens_per_s == data["update_tokens_per_s"]["48"]
    expected = projection.sweep(figures, 1171, 64, 24)
    assert [p["gpu_hours"] for p in data["projection"]] == pytest.approx([p.gpu_hours for p in expected])
    assert [p["completion_tokens"] for p in data["projection"]] == list(projection.SWEEP)
    assert projection.table(expected) in printed and "12 epochs over 1171 training prompts" in printed


def test_the_step_batch_is_the_nearest_measured_and_measure_needs_the_training_set(capsys):
    assert STEP_BATCH == 32
    m = Measured("cpu", {}, 10, 4, 1, decode_ms={"8": {"dynamic": 1.0}, "64": {"dynamic": 5.0, "static": "not available"}},
                 update_tokens_per_s={"512": 10.0, "2048": 7.0}, optimizer_step_s=0.1)
    assert m.figures() == projection.Figures(1.0, 7.0, 0.1)  # 8 is nearer 32 than 64 is; the longest update
    from embodied_r.apps.cli import main

    assert main(["check", "gpu", "--measure", "--device", "cpu", "--policy-shape", "tiny"]) == 2
    assert "pass --train-prompts N" in capsys.readouterr().out
