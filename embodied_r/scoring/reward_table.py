"""The rewards a GRPO stage names: a reward is its function (``rewards``) and one entry here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from embodied_r.backends.base import BackendConfig
from embodied_r.scoring.config import ScoringConfig


class RewardInputs(Protocol):  # the training config's fields a factory reads
    scoring: ScoringConfig
    reference: BackendConfig
    consistency_requires_correct: bool


@dataclass(frozen=True)
class Reward:
    make: Callable[[RewardInputs], Callable[..., list[Any]]]
    # It asks ``training.reference``: the memory estimate counts that model where a stage weighs it.
    asks_reference: bool = False


def _rewards() -> Any:
    # Imported when a run builds its rewards: a recipe names them without loading their code.
    from embodied_r.scoring import rewards

    return rewards


# In the order the trainer adds them up, whatever a recipe's order. TRL logs each under its
# function's __name__ (format_reward, ...), which the learning figures, MLflow and report read.
REWARDS: dict[str, Reward] = {
    "format": Reward(lambda run: _rewards().make_format_reward(run.scoring.format_rule)),
    "accuracy": Reward(lambda run: _rewards().make_accuracy_reward(run.scoring.answer_parser)),
    # A completion the reference failed to score gets its group's mean (fill_unscored): TRL's
    # nansum would otherwise count it as inconsistent.
    "consistency": Reward(lambda run: _rewards().make_consistency_reward(
        run.reference, require_correct=run.consistency_requires_correct, fill_unscored=True, scoring=run.scoring),
        asks_reference=True),
}
