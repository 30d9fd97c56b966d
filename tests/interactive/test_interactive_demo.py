"""The Embodied-Reasoner demo's parts that make it learn: its agent's tokenizer, the labels it
learns from, the scripted expert's asides, the learning figures an SFT stage reports, the
references an evaluation is read beside and the verdict, ``--seed`` and the thread setting."""

from __future__ import annotations

import json
import random

import pytest

from embodied_r.interactive.prompts import FEEDBACK
from embodied_r.config import load_reasoner as load
from embodied_r.pipeline import plan
from embodied_r.interactive.reference import references, verdict
from embodied_r.interactive.synthetic import (
    EXPERT_TEXTS,
    expert_replies,
    fixed_texts,
    make_test_cases,
    object_types,
    play,
)
from embodied_r.interactive.episode import EpisodeConfig
from embodied_r.training.learning import logged_quarters, sft_figures

CASES = make_test_cases(22, seed=0, start=10_001)  # two tasks of each of the 11 types


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory) -> dict[int, list]:
    """Stage 1 and stage 3 trajectories of every task type, played in the built-in house."""
    root = tmp_path_factory.mktemp("play")
    return {stage: play(CASES[:11], stage, root, seed=0) for stage in (1, 3)}


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    from embodied_r.backends.models import load_vlm_processor, resolve_model

    with pytest.MonkeyPatch.context() as env:
        env.setenv("EMBODIED_R_HOME", str(tmp_path_factory.mktemp("home")))
        folder = resolve_model("tiny:vlm-reasoner")
    return load_vlm_processor(folder)


def test_the_agents_fixed_texts_and_objects_are_one_token_each(processor, trajectories):
    tok = processor.tokenizer
    for text in (*fixed_texts(), *object_types()):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
        assert len(tok(text, add_special_tokens=False)["input_ids"]) == 1, text[:40]
    # A ten-step trajectory is its content: at most a few hundred tokens, images included.
    from embodied_r.interactive.sft_data import Collator

    longest = max(trajectories[1], key=lambda r: len(r["episode"].images))["episode"]
    ids = Collator(processor, load("reasoner-demo").sft.max_pixels).encode(
        {"conversation": json.dumps(longest.messages), "image_files": longest.images})["input_ids"]
    assert len(longest.images) == 11 and ids.shape[1] < 500, ids.shape


def test_labels_cover_the_replies_after_the_first_feedback_only(processor, trajectories):
    """The label mask, read back as text: in a stage-3 conversation exactly the assistant
    replies after the first ``<|feedback|>`` turn, each closed by its end marker; no system,
    user or observation text, no image placeholder."""
    from embodied_r.interactive.sft_data import IGNORE, Collator

    collator = Collator(processor, 3136)
    for rec in trajectories[3]:
        ep = rec["episode"]
        batch = collator.encode({"conversation": json.dumps(ep.messages), "image_files": ep.images})
        ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
        learned = processor.tokenizer.decode([i for i, lab in zip(ids, labels) if lab != IGNORE])
        feedback = next(i for i, m in enumerate(ep.messages) if FEEDBACK in m["content"])
        after = [m["content"] for m in ep.messages[feedback:] if m["role"] == "assistant"]
        assert learned == "".join(f"{reply}<|im_end|>" for reply in after)
        assert after[0].startswith("<Reflection>")


def test_the_experts_aside_comes_before_a_step_drawn_at_random_and_every_trajectory_succeeds(trajectories):
    for stage, text in ((2, EXPERT_TEXTS["look"]), (3, EXPERT_TEXTS["rush"])):
        places = set()
        for case in CASES:
            replies = expert_replies(case, stage, random.Random(f"0/{case['identity']}"))
            places.add(next(i for i, r in enumerate(replies) if text in r))
            assert replies == expert_replies(case, stage, random.Random(f"0/{case['identity']}"))
        assert len(places) >= 3, places  # not always the first turn
    assert all(rec["episode"].result()["success"] == 1 for recs in trajectories.values() for rec in recs)
    # A slip is refused with a feedback turn, and the step it skipped is taken next.
    for rec in trajectories[3]:
        msgs = rec["episode"].messages
        i = next(i for i, m in enumerate(msgs) if FEEDBACK in m["content"])
        assert "<Reflection>" in msgs[i + 1]["content"] and "navigate to" in msgs[i + 1]["content"]


def test_learning_figures_compare_the_first_and_last_quarter_of_the_logged_steps():
    history = [{"step": s, "loss": 2.0 - s / 10, "mean_token_accuracy": s / 10, "learning_rate": lr}
               for s, lr in zip(range(1, 9), (0.0, 1e-3, 2e-3, 2e-3, 1e-3, 5e-4, 1e-4, 0.0))]
    history.append({"step": 8, "train_runtime": 1.0, "train_loss": 1.0, "mean_token_accuracy": 9.0})
    acc = logged_quarters(history, "mean_token_accuracy")
    assert acc == {"first": pytest.approx(0.15), "last": pytest.approx(0.75), "steps": 8}
    figures = sft_figures(history)
    assert figures["peak_learning_rate"] == 2e-3 and figures["loss"]["first"] > figures["loss"]["last"]
    assert logged_quarters([], "loss") == {"first": None, "last": None, "steps": 0}
    assert logged_quarters(history[:1], "loss")["first"] == logged_quarters(history[:1], "loss")["last"]


def test_the_references_are_the_expert_replayed_and_ending_at_once(tmp_path):
    found = references(CASES[:11], tmp_path, EpisodeConfig())
    assert found["ceiling"] == {"success": 1.0, "completeness": 1.0}
    assert found["free"]["success"] == 0.0 and 0.2 < found["free"]["completeness"] < 0.35
    # A step limit shorter than the long tasks lowers the ceiling, as it limits the agent.
    assert references(CASES[:11], tmp_path / "short", EpisodeConfig(step_limit=4))["ceiling"]["success"] < 0.5


def test_the_verdict_claims_learning_only_above_the_free_point_on_both_figures():
    ceiling, free = {"success": 1.0, "completeness": 1.0}, {"success": 0.0, "completeness": 0.268}
    learned = verdict(14 / 33, 0.70, 33, ceiling, free)
    assert "succeeds on 14 of 33" in learned and "+43.2 points" in learned and learned.endswith("at this seed.")
    assert "taught it to act" in learned
    assert "no learning shown" in verdict(0.0, 0.268, 33, ceiling, free)
    assert "no learning shown" in verdict(1 / 33, 0.25, 33, ceiling, free)
    alone = verdict(14 / 33, 0.70, 33, ceiling, free, trained_here=False)  # reasoner-eval of any model
    assert alone.startswith("The model succeeds") and "SFT" not in alone


def test_seed_changes_the_trainers_and_sampling_not_the_data_and_threads_change_no_key(tmp_path):
    from embodied_r.apps.cli_reasoner import seed_overrides

    base = plan(load("reasoner-demo"), tmp_path)
    seeded = plan(load("reasoner-demo", seed_overrides(1)), tmp_path)
    assert seeded["reasoner_data"].key == base["reasoner_data"].key
    assert all(seeded[n].key != base[n].key for n in base if n != "reasoner_data")
    assert json.loads(json.dumps(seeded["reasoner_sft_imitation"].config))["sft"]["seed"] == 1
    threads = plan(load("reasoner-demo", {"torch_threads": 2}), tmp_path)
    assert [threads[n].key for n in threads] == [base[n].key for n in base]
    assert base["reasoner_sft_correction"].config["torch_threads"] == 1
    assert threads["reasoner_evaluate"].config["torch_threads"] == 2
