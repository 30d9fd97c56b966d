"""What `make rehearse` judges and what it adds to the trainer, checked without vLLM or DeepSpeed:
the ZeRO-3 item's verdict on a resume and a stage chain (planted faults included), the backends'
agreement, the CPU adapters' import hook and trainer arguments, the sync check's arithmetic,
the colocated engine's own settings, and a deployment's dotted overrides. The engines themselves
run in the rehearsal (docs/testing.md, "The GPU recipes rehearsed on a CPU")."""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from embodied_r.backends import cpu_adapters
from embodied_r.checks.rehearse_verdicts import agreement, same_text, zero3_problems
from embodied_r.config import load_recipe, nested
from embodied_r.training.config import OWNED_GRPO_ARGS, VLLMRollouts
from embodied_r.training.grpo import grpo_kwargs
from embodied_r.training.vllm_colocate import PROBE_COMPLETION, gap, probe_ids

# Three stages of 4 steps chained by stage_chain: resume on 2 processes; stage 2 lost a rank after
# checkpoint-2 and its retry resumed there (the figures a healthy rehearsal run wrote).
HEALTHY = [
    {"processes": 2, "steps": 4, "steps_this_run": 4, "resumed_from_step": 0, "first_adam_step": 0,
     "first_learning_rate": 0.0, "last_learning_rate": 0.0092, "vllm_sync_checks": 4, "vllm_sync_max_gap": 1.2e-5,
     "vllm_sync_tolerance": 1e-3},
    {"processes": 2, "steps": 4, "steps_this_run": 2, "resumed_from_step": 2, "first_adam_step": 6,
     "first_learning_rate": 0.0075, "last_learning_rate": 0.0050, "vllm_sync_checks": 2, "vllm_sync_max_gap": 2.5e-5,
     "vllm_sync_tolerance": 1e-3},
    {"processes": 2, "steps": 4, "steps_this_run": 4, "resumed_from_step": 0, "first_adam_step": 8,
     "first_learning_rate": 0.0050, "last_learning_rate": 0.0002, "vllm_sync_checks": 4, "vllm_sync_max_gap": 2.4e-5,
     "vllm_sync_tolerance": 1e-3},
]
CHECKPOINT_2 = {"adam_step": 6, "next_lr": 0.0075, "schedule_step": 6, "global_step": 2}


def planted(**changes: dict) -> list[dict]:
    stages = copy.deepcopy(HEALTHY)
    for index, values in changes.items():
        stages[int(index[-1]) - 1].update(values)
    return stages


def test_a_healthy_resume_and_chain_pass():
    assert zero3_problems(HEALTHY, 2, CHECKPOINT_2) == []


def test_a_resume_that_restarts_at_step_0_fails():
    # The checkpoint is ignored: the retry runs all 4 steps again from the chain's start.
    stages = planted(s2={"steps_this_run": 4, "resumed_from_step": 0, "first_adam_step": 4,
                         "first_learning_rate": 0.0092, "vllm_sync_checks": 4})
    problems = zero3_problems(stages, 2, CHECKPOINT_2)
    assert any("stage2 resumed from step 0" in p for p in problems)
    assert any("Adam step after the resume 4" in p for p in problems)


def test_a_schedule_not_carried_into_the_next_stage_fails():
    # DeepSpeed's checkpoint restores Adam but not the trainer's scheduler: stage 3 restarts warm-up.
    problems = zero3_problems(planted(s3={"first_learning_rate": 0.0}), 2, CHECKPOINT_2)
    assert problems == ["stage3 started at lr 0.0, where the chain's schedule left off at 0.005"]


def test_a_stage_that_restarts_the_chains_schedule_fails():
    # Stage 2 began its own schedule (its checkpoint-2 stands at step 2 of it, not at 4 + 2): Adam
    # carried on, and the retry resumed that restarted schedule faithfully.
    problems = zero3_problems(HEALTHY, 2, {**CHECKPOINT_2, "schedule_step": 2})
    assert problems == ["checkpoint-2 of stage2 holds the schedule at step 2, the chain's is 6: stage 2 did not "
                        "carry on stage 1's schedule"]


def test_a_resume_that_loses_the_schedule_or_adam_fails():
    assert zero3_problems(planted(s2={"first_learning_rate": 0.0092}), 2, CHECKPOINT_2)
    assert zero3_problems(planted(s2={"first_adam_step": 0}, s3={"first_adam_step": 2}), 2, CHECKPOINT_2)


def test_a_stage_without_its_sync_checks_or_processes_fails():
    assert zero3_problems(planted(s1={"vllm_sync_checks": 3}), 2, CHECKPOINT_2)
    assert zero3_problems(planted(s3={"vllm_sync_max_gap": 0.02}), 2, CHECKPOINT_2)
    assert zero3_problems(planted(s2={"processes": 1}), 2, CHECKPOINT_2)


def test_agreement_counts_answers_and_text_up_to_an_unfinished_character():
    theirs = {"a": {"prediction": "B", "completion": "<answer>B</answer>\ufffd"},
              "b": {"prediction": "", "completion": "xyz"},
              "c": {"prediction": "C", "completion": "C"}}
    ours = {"a": {"prediction": "B", "completion": "<answer>B</answer>"},
            "b": {"prediction": "", "completion": "xyq"}}
    assert agreement(ours, theirs) == (2 / 3, 1 / 3)
    assert same_text("abc\ufffd\ufffd", "abc") and not same_text("abc", "abd")


def test_the_import_hook_fires_when_the_module_runs_even_after_a_probe(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    # transformers probes packages with find_spec before importing them: the adapter must still
    # run at the import that follows (a hook spent on the probe left torchvision unadapted).
    (tmp_path / "probed_pkg.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    monkeypatch.setitem(cpu_adapters._HOOKS, "probed_pkg", ("after", lambda m: seen.append(m.VALUE) or True))
    finder = cpu_adapters._Finder()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    assert importlib.util.find_spec("probed_pkg") is not None
    assert seen == []
    importlib.import_module("probed_pkg")
    assert seen == [1] and "probed_pkg" in cpu_adapters.APPLIED
    monkeypatch.delitem(sys.modules, "probed_pkg")


def test_trainer_overrides_name_gloo_for_several_cpu_processes_only():
    assert cpu_adapters.trainer_overrides(2) == {"ddp_backend": "gloo"}
    assert cpu_adapters.trainer_overrides(1) == {}


def test_the_sync_checks_gap_and_probe(tiny_lm_path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm_path)
    conversation = [{"role": "user", "content": "Which direction is the bridge?"}]
    ids, start = probe_ids(tok, conversation)
    head = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    head = head["input_ids"] if hasattr(head, "keys") else head
    assert ids[:start] == list(head)
    assert tok.decode(ids[start:]) == PROBE_COMPLETION
    assert gap([-1.0, -2.5], [-1.0, -2.0]) == 0.5
    with pytest.raises(ValueError):
        gap([-1.0], [-1.0, -2.0])


def test_the_colocated_engines_own_settings_are_not_trls():
    rollouts = VLLMRollouts(mode="colocate", sync_check=True, sync_tolerance=1e-4, dtype="float32")
    kwargs = rollouts.grpo_kwargs()
    assert kwargs["vllm_mode"] == "colocate" and not {"vllm_sync_check", "vllm_sync_tolerance", "vllm_dtype"} & set(kwargs)
    assert "vllm_mode" in OWNED_GRPO_ARGS and "vllm_dtype" not in OWNED_GRPO_ARGS
    with pytest.raises(ValidationError, match="colocated engine"):
        VLLMRollouts(mode="server", sync_check=True)


def test_the_rehearsal_recipe_is_paper_8gpu_shaped():
    recipe = load_recipe("rehearsal")
    training = recipe.training
    assert training.deepspeed() and training.accelerate_processes() == 2 and training.stage_chain == "resume"
    assert training.vllm is not None and training.vllm.mode == "colocate" and training.vllm.sync_check
    kwargs = grpo_kwargs(training.stages[0], training, Path("/w"), [0.7, 0.3], [], world=2)
    assert kwargs["use_vllm"] and kwargs["gradient_accumulation_steps"] == 2
    assert recipe.perception.backend.kind == "vllm" and recipe.evaluation.backend.kind == "vllm"


def test_a_deployments_dotted_overrides_read_as_set_writes_them():
    # docs/running.md: a deployment's `overrides` are "a dict of recipe values, as --set takes them".
    assert nested({"training.learning_rate": 1e-6, "training.seed": 3, "name": "x"}) == {
        "training": {"learning_rate": 1e-6, "seed": 3}, "name": "x"}
    recipe = load_recipe("smoke", {"training.learning_rate": 2e-4, "training.stages.stage3.epochs": 1})
    assert recipe.training.learning_rate == 2e-4
    assert [s.epochs for s in recipe.training.stages] == [2, 2, 1]
