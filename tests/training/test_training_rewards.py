"""What the GRPO trainer sees of the rewards: TRL's own reward call and its group ranking,
with the consistency reference a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from embodied_r.training.config import GRPOStageConfig
from tests.stage_inputs import build_records, catalog_row
from tests.training.test_training import tiny_cfg
from tests.servers import ScriptedReference as Reference

GENERATIONS = 4


@pytest.fixture(scope="module")
def two_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = [catalog_row("urbanvideo:0", "train", answer="A"), catalog_row("urbanvideo:1", "train", answer="B")]
    return build_records(tmp_path_factory.mktemp("two_records"), rows)


def _answer(think: str, letter: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": f"<think>{think}</think><answer>{letter}</answer>"}]


def test_an_unscored_completion_is_not_ranked_below_its_group(reference: Reference, two_records: Path,
                                                              tmp_path: Path, tiny_lm_path: Path) -> None:
    """Every completion below has the right answer in the right format, so only the
    consistency reward tells them apart. The reference agrees with some, disagrees with
    one and fails on one per group: the failed one must rank between them, at its
    group's mean, not with the one it disagreed with."""
    import torch
    from trl import GRPOTrainer

    from embodied_r.training.grpo import grpo_args, load_dataset, reward_setup

    stage = GRPOStageConfig(name="s3", rewards={"format": 0.1, "accuracy": 0.7, "consistency": 0.2})
    cfg = tiny_cfg([stage], num_generations=GENERATIONS, per_device_train_batch_size=8)
    cfg.reference = reference.backend()
    funcs, weights = reward_setup(stage, cfg)
    dataset = load_dataset(two_records)
    trainer = GRPOTrainer(model=str(tiny_lm_path), reward_funcs=funcs,
                          args=grpo_args(stage, cfg, tmp_path, weights, []), train_dataset=dataset)

    rows = {row["uid"]: row for row in dataset}
    says = {"urbanvideo:0": ["REF=A", "REF=FAIL", "REF=C", "REF=A"],  # agree, fail, disagree, agree
            "urbanvideo:1": ["REF=D", "REF=B", "REF=FAIL", "REF=B"]}  # disagree, agree, fail, agree
    inputs, completions = [], []
    for uid, thinks in says.items():  # TRL's order: the generations of one prompt side by side
        for think in thinks:
            inputs.append(rows[uid])
            completions.append(_answer(think, rows[uid]["solution"]))
    prompts = [row["prompt"] for row in inputs]

    per_func = trainer._calculate_rewards(inputs, prompts, completions, [[1]] * len(completions))
    funcs[2].close()
    assert len(reference.bodies) == 8  # every completion was asked, once: the refusals not retried
    consistency = per_func[:, 2].tolist()
    assert consistency == pytest.approx([1.0, 2 / 3, 0.0, 1.0, 0.0, 1.0, 2 / 3, 1.0])
    assert per_func[:, 0].tolist() == [1.0] * 8 and per_func[:, 1].tolist() == [1.0] * 8

    # TRL's aggregation: weighted nansum, then each reward minus its group's mean.
    rewards = (per_func * trainer.reward_weights.unsqueeze(0)).nansum(dim=1)
    advantages = (rewards.view(-1, GENERATIONS) - rewards.view(-1, GENERATIONS).mean(dim=1, keepdim=True)).flatten()
    for failed, disagreed, agreed in ((1, 2, 0), (6, 4, 5)):
        assert advantages[failed].item() == pytest.approx(0.0, abs=1e-6)
        assert advantages[disagreed] < advantages[failed] < advantages[agreed]
    assert torch.isfinite(advantages).all()


def test_a_group_the_reference_never_scored_stays_unscored(reference: Reference) -> None:
    """With no known score in a group there is no mean to give: the reward stays None for
    all of it (equal within the group, so TRL ranks none of them by it)."""
    from embodied_r.scoring.rewards import make_consistency_reward

    reward = make_consistency_reward(reference.backend(), fill_unscored=True)
    texts = ["<think>REF=FAIL</think><answer>A</answer>", "<think>REF=FAIL</think><answer>A</answer>",
             "<think>REF=A</think><answer>A</answer>", "<think>REF=FAIL</think><answer>A</answer>"]
    out = reward(completions=texts, solution=["A"] * 4, question=["q"] * 4, uid=["x", "x", "y", "y"])
    reward.close()
    assert out == [None, None, 1.0, 1.0]
