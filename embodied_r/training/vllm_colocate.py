"""What the project adds to TRL's colocated vLLM engine: its dtype, and the check that its
rollouts come from the policy being trained.

TRL 1.16 builds the engine without a dtype, so vLLM's ``auto`` runs a float32 checkpoint in
bfloat16 (``_resolve_auto_dtype`` in ``vllm/config/model.py``); ``training.vllm.dtype`` names it
(``engine_dtype``), for example float32 where the policy trains in float32.

With ``training.vllm.mode: colocate`` TRL copies the policy's weights into each process's vLLM
engine before the rollouts of every step (``VLLMGeneration.sync_weights``). A sync that writes
nothing (a renamed parameter, a layer that keeps a packed copy, a tied head computed from its
old matrix) raises no error: the rollouts then come from the first weights while the loss
trains the policy, and the run looks healthy for days. ``training.vllm.sync_check`` guards it:
after each sync, one fixed completion of a training prompt is scored by both, token by token,
and the largest difference of their log-probabilities is logged; above the tolerance the stage
stops with a sentence that says so. Each process checks its own engine; under ZeRO-3 the
policy's forward pass is a collective, which every process makes at each sync.
"""

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
    """Build TRL's colocated engines of this process with ``dtype`` (TRL passes none)."""
    import functools

    import trl.generation.vllm_generation as generation

    generation.LLM = functools.partial(generation.LLM, dtype=dtype)


def probe_ids(tokenizer: Any, prompt: list[dict[str, Any]] | str) -> tuple[list[int], int]:
    """Token ids of ``prompt`` (a conversation, chat-templated as TRL's rollouts are, or text)
    followed by ``PROBE_COMPLETION``, and how many of them are the prompt's."""
    if isinstance(prompt, str):
        head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    else:
        head = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        if hasattr(head, "keys"):
            head = head["input_ids"]
    tail = tokenizer(PROBE_COMPLETION, add_special_tokens=False)["input_ids"]
    return list(head) + list(tail), len(head)


def policy_logprobs(model: Any, ids: list[int], start: int) -> list[float]:
    """The policy's log-probability of each token of ``ids`` from ``start`` on."""
    import torch

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[i - 1, ids[i]]) for i in range(start, len(ids))]


def engine_logprobs(llm: Any, ids: list[int], start: int) -> list[float]:
    """vLLM's log-probability of each token of ``ids`` from ``start`` on (its prompt log-probs)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    return [float(out.prompt_logprobs[i][ids[i]].logprob) for i in range(start, len(ids))]


def gap(a: list[float], b: list[float]) -> float:
    """The largest difference of two log-probability lists (their lengths must agree)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"log-probabilities of {len(a)} and {len(b)} tokens cannot be compared")
    return max(abs(x - y) for x, y in zip(a, b))


class SyncCheck:
    """Wraps a trainer's ``vllm_generation.sync_weights``: after the original, both score the probe."""

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
        """What the stage's result records: how many syncs were checked and the largest gap."""
        return {"vllm_sync_checks": len(self.checks),
                "vllm_sync_max_gap": max((c["max_logprob_gap"] for c in self.checks), default=None),
                "vllm_sync_tolerance": self.tolerance}


def shut_down(trainer: Any) -> None:
    """Stop the colocated engine while every rank is alive (after a barrier). Left to the
    interpreter's exit, the engine's finalizer tears down process groups that the trainer's
    own teardown (``child.end_process_group``) has already destroyed, and each rank prints a
    ``ValueError: Invalid process group specified`` traceback after its work is saved. The
    engine's shutdown destroys the default group too, which ends the launch's group here."""
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
