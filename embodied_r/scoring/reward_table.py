"""The rewards a GRPO stage names, each a factory building it for a training run.

A reward is its function (``rewards``), one entry here, and its weight in a recipe's stage
(``training.stages[].rewards``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from embodied_r.backends.base import BackendConfig
from embodied_r.scoring.config import ScoringConfig


class RewardInputs(Protocol):
    """What a reward's factory reads: the training config's fields of these names."""

    scoring: ScoringConfig
    reference: BackendConfig
    consistency_requires_correct: bool


@dataclass(frozen=True)
class Reward:
    """One entry of ``REWARDS``: how a training run builds the reward."""

    make: Callable[[RewardInputs], Callable[..., list[Any]]]
    # It asks ``training.reference``: the memory estimate counts that model where a stage weighs it.
    asks_reference: bool = False


def _rewards() -> Any:
    # Imported when a run builds its rewards: a recipe names them without loading their code.
    from embodied_r.scoring import rewards

    return rewards


# The rewards a GRPO stage names (``GRPOStageConfig.rewards``), in the order the trainer adds
# them up whatever order a recipe lists them in. TRL logs each under its function's __name__
# (format_reward, ...), which the learning figures, MLflow metrics and report read.
REWARDS: dict[str, Reward] = {
    "format": Reward(lambda run: _rewards().make_format_reward(run.scoring.format_rule)),
    "accuracy": Reward(lambda run: _rewards().make_accuracy_reward(run.scoring.answer_parser)),
    # A completion the reference failed to score gets its group's mean (fill_unscored): TRL's
    # nansum would otherwise count it as inconsistent.
    "consistency": Reward(lambda run: _rewards().make_consistency_reward(
        run.reference, require_correct=run.consistency_requires_correct, fill_unscored=True, scoring=run.scoring),
        asks_reference=True),
}
