"""What an agent's figures are read beside in the built-in house (scripted ceiling, free point), and the verdict."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

from embodied_r.interactive.episode import EpisodeConfig, embedding_matcher, run_episodes
from embodied_r.interactive.household import HouseholdEnvironment
from embodied_r.interactive.metrics import aggregate
from embodied_r.interactive.synthetic import expert_replies

END = "<DecisionMaking>end</DecisionMaking>"
FIGURES = ("success", "completeness")


def scripted(cases: list[dict[str, Any]], policy: Callable[[dict[str, Any]], list[str]], out: Path,
             episode: EpisodeConfig, match: Any = None) -> dict[str, float]:
    """Success and completeness of a policy whose replies ``policy(task)`` gives (then ``end``)."""
    results = []
    for case in cases:
        replies = iter(policy(case))
        [ep] = run_episodes([case], HouseholdEnvironment, lambda convs: [next(replies, END) for _ in convs],
                            Path(out) / str(case["identity"]), episode, batch=1, match=match)
        results.append(ep.result())
    overall = aggregate(results)["all"]
    return {name: float(overall[name]) for name in FIGURES}


def references(cases: list[dict[str, Any]], out: Path, episode: EpisodeConfig) -> dict[str, dict[str, float]]:
    """The scripted ceiling and the free point under ``episode``'s rules, its step limit included."""
    match = embedding_matcher(episode)
    return {"ceiling": scripted(cases, lambda t: expert_replies(t, 1, random.Random(0)), Path(out) / "ceiling",
                                episode, match),
            "free": scripted(cases, lambda t: [END], Path(out) / "free", episode, match)}


def verdict(success: float, completeness: float, episodes: int, ceiling: dict[str, float],
            free: dict[str, float], trained_here: bool = True) -> str:
    """One sentence on the figures of the SFT-trained agent (``trained_here``) or any model; learning
    is claimed only when it beats the free point on both figures."""
    won = round(success * episodes)
    gain = 100 * (completeness - free["completeness"])
    who = "The SFT-trained agent" if trained_here else "The model"
    head = (f"{who} succeeds on {won} of {episodes} test tasks ({100 * success:.1f} %; the scripted "
            f"ceiling {100 * ceiling['success']:.1f} %, ending at once {100 * free['success']:.1f} %), task "
            f"completeness {100 * completeness:.1f} % ({gain:+.1f} points on ending at once)")
    if success > free["success"] and completeness > free["completeness"]:
        tail = "the SFT stages taught it to act at this seed" if trained_here else "it acts beyond ending at once"
    else:
        tail = "no learning shown at this seed" if trained_here else "no better than ending at once"
    return f"{head}: {tail}."
