"""What the project adds to TRL's colocated vLLM engine: its dtype (TRL passes none, so
vLLM's auto runs a float32 checkpoint in bfloat16), and ``sync_check``: a weight sync that
writes nothing raises no error, and rollouts would come from the first weights for days. Each
process checks its own engine (under ZeRO-3 the policy's forward is a collective)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from embodied_r.errors import SyncMismatch

log = logging.getLogger(__name__)

SYNC_FILE = "vllm_sync.json"
# The completion both score: the paper's output format, so its tokens are ones the policy
# writes; what matters is that it is the same every time.
PROBE_COMPLETION = "<think>I moved forward, so the landmark is on my left now.</think><answer>A</answer>"


def engine_dtype(dtype: str) -> None:
    import functools

    import trl.generation.vllm_generation as generation

    generation.LLM = functools.partial(generation.LLM, dtype=dtype)


def probe_ids(tokenizer: Any, prompt: list[dict[str, Any]] | str) -> tuple[list[int], int]:
    """Token ids of ``prompt`` and ``PROBE_COMPLETION``, and how many are the prompt's."""
    from embodied_r.training.policy import prompt_ids

    head = prompt_ids(tokenizer, prompt)
    tail = tokenizer(PROBE_COMPLETION, add_special_tokens=False)["input_ids"]
    return list(head) + list(tail), len(head)


def policy_logprobs(model: Any, ids: list[int], start: int) -> list[float]:
    import torch

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[i - 1, ids[i]]) for i in range(start, len(ids))]


def engine_logprobs(llm: Any, ids: list[int], start: int) -> list[float]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    return [float(out.prompt_logprobs[i][ids[i]].logprob) for i in range(start, len(ids))]


def gap(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        raise ValueError(f"log-probabilities of {len(a)} and {len(b)} tokens cannot be compared")
    return max(abs(x - y) for x, y in zip(a, b))


class SyncCheck:
    """After each ``sync_weights``, the engine and the policy score the probe."""

    def __init__(self, trainer: Any, prompt: Any, tolerance: float, work: Path):
        self.trainer = trainer
        self.generation = trainer.vllm_generation
        self.ids, self.start = probe_ids(trainer.processing_class, prompt)
        self.tolerance = tolerance
        self.path = Path(work) / SYNC_FILE
        self.checks: list[dict[str, float]] = []
        self._sync = self.generation.sync_weights
        self.generation.sync_weights = self.sync

    def sync(self) -> None:
        self._sync()
        step = int(self.trainer.state.global_step)
        ours = policy_logprobs(self.generation.model, self.ids, self.start)
        theirs = engine_logprobs(self.generation.llm, self.ids, self.start)
        found = gap(ours, theirs)
        self.checks.append({"step": step, "max_logprob_gap": found})
        if self.trainer.accelerator.is_main_process:
            self.path.write_text(json.dumps({"tolerance": self.tolerance, "tokens": len(ours),
                                             "checks": self.checks}, indent=1))
        log.info("vLLM weight sync at step %d: largest log-prob gap %.2e over %d tokens", step, found, len(ours))
        if found > self.tolerance:
            raise SyncMismatch(
                f"vLLM's rollout engine does not hold the policy's weights after the sync at step {step}: "
                f"their log-probabilities of a fixed completion differ by up to {found:.3g} "
                f"(tolerance {self.tolerance:g}, training.vllm.sync_tolerance); rollouts would come from "
                "stale weights. Check the engine's weight loading for this model (names, tied embeddings, "
                "dtype) before training on")

    def summary(self) -> dict[str, Any]:
            return {"vllm_sync_checks": len(self.checks),
                "vllm_sync_max_gap": max((c["max_logprob_gap"] for c in self.checks), default=None),
                "vllm_sync_tolerance": self.tolerance}


def shut_down(trainer: Any) -> None:
    """Stop the engine while every rank is alive: at exit its finalizer would tear down groups
    ``child.end_process_group`` already destroyed (a traceback per rank). Its shutdown ends the
    default group too."""
    generation = getattr(trainer, "vllm_generation", None)
    llm = getattr(generation, "llm", None)
    if llm is None:
        return
    import torch.distributed as dist

    from embodied_r.backends.vllm_engine import shutdown_engine

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    shutdown_engine(llm)
    generation.llm = None
