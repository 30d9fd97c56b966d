"""Where a GRPO trainer's time and GPU memory go: generation, scoring and the update over the
run and for its first and last step (the first carries the warm-up, the last is what the rest
costs), and the process's peak GPU memory."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Callable


class PhaseTimer:
    """Seconds in TRL's ``_generate`` and ``_calculate_rewards``; the rest of a step is the update."""

    PHASES = {"_generate": "generation", "_calculate_rewards": "reward"}

    def __init__(self, trainer: Any):
        self.seconds: dict[str, float] = defaultdict(float)
        self.steps: list[dict[str, float]] = []  # the first and the last step's split
        self._step_start: tuple[float, dict[str, float]] | None = None
        for method, phase in self.PHASES.items():
            original = getattr(trainer, method, None)
            if original is not None:
                setattr(trainer, method, self._timed(original, phase))

    def _timed(self, func: Callable[..., Any], phase: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - started

        return wrapper

    def split(self, total: float) -> dict[str, Any]:
        out: dict[str, Any] = {f"seconds_{phase}": round(self.seconds.get(phase, 0.0), 3)
                               for phase in self.PHASES.values()}
        out["seconds_update"] = round(max(total - sum(self.seconds.values()), 0.0), 3)
        if self.steps:
            out["first_step"] = self.steps[0]
            out["last_step"] = self.steps[-1]
        return out

    def step_began(self) -> None:
        self._step_start = (time.perf_counter(), dict(self.seconds))

    def step_ended(self) -> None:
        if self._step_start is None:
            return
        started, before = self._step_start
        total = time.perf_counter() - started
        phases = {phase: self.seconds.get(phase, 0.0) - before.get(phase, 0.0) for phase in self.PHASES.values()}
        record = {"seconds": round(total, 3), **{f"seconds_{p}": round(v, 3) for p, v in phases.items()},
                  "seconds_update": round(max(total - sum(phases.values()), 0.0), 3)}
        self.steps = [self.steps[0], record] if self.steps else [record]
        self._step_start = None

    def callback(self) -> Any:
        from transformers import TrainerCallback

        timer = self

        class StepPhases(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                timer.step_began()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                timer.step_ended()

        return StepPhases()


GIB = 1024 ** 3


def peak_gpu_memory() -> dict[str, float]:
    try:
        import torch
    except ImportError:
        return {}
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {"peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / GIB, 2),
            "peak_gpu_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 2)}
