"""``embodied-r check gpu --measure``: a random-weight model of a recipe's policy shape timed on
this machine (decoding per step, the update's tokens per second, one AdamW step, the update's
peak memory beside its estimate), and the paper schedule's GPU-hours projected from those rates."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from embodied_r.checks import projection
from embodied_r.training.shapes import ModelShape

BATCHES = (8, 32, 64)
LENGTHS = (512, 1024, 2048)
STEP_BATCH = projection.PROMPTS_PER_STEP * projection.COMPLETIONS_PER_PROMPT
# Parts of the estimate that one timed update holds (no KL reference, no generation, no vLLM).
UPDATE_PARTS = ("policy", "gradients", "optimizer", "autocast_copies", "activations", "lm_head")


@dataclass
class Measured:
    device: str
    shape: dict[str, Any]
    prompt_tokens: int
    decode_tokens: int
    micro_batch: int
    decode_ms: dict[str, dict[str, float | str]] = field(default_factory=dict)  # batch -> cache -> ms or why not
    update_tokens_per_s: dict[str, float] = field(default_factory=dict)  # completion length -> tokens/s
    optimizer_step_s: float = 0.0
    peak_gib: float | None = None
    estimate_gib: float | None = None

    @property
    def error_pct(self) -> float | None:
        if self.peak_gib is None or not self.estimate_gib:
            return None
        return 100 * (self.estimate_gib - self.peak_gib) / self.peak_gib

    def figures(self) -> projection.Figures:
        """The decode at the batch nearest a step's (its fastest cache), the update at the
        longest length, the optimizer step."""
        batch = min(self.decode_ms, key=lambda b: abs(int(b) - STEP_BATCH))
        decode = min(v for v in self.decode_ms[batch].values() if isinstance(v, float))
        return projection.Figures(decode, self.update_tokens_per_s[max(self.update_tokens_per_s, key=int)],
                                  self.optimizer_step_s)


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _decode_ms(model: Any, ids: Any, tokens: int, sync: Callable[[], None], cache: str) -> float:
    """Milliseconds per decoding step: a ``tokens``-token generate less a one-token one (the
    prefill), over the tokens between."""
    extra = {"cache_implementation": "static"} if cache == "static" else {}

    def gen(n: int) -> Callable[[], Any]:
        return lambda: model.generate(ids, attention_mask=ids.new_ones(ids.shape), max_new_tokens=n,
                                      min_new_tokens=n, do_sample=False, pad_token_id=0, **extra)

    for _ in range(2):  # warm-up: kernels, the allocator, the static cache's buffers
        gen(2)()
    # Medians of three: a single timing of a small model is at the mercy of the scheduler.
    full = statistics.median(_timed(gen(tokens), sync) for _ in range(3))
    prefill = statistics.median(_timed(gen(1), sync) for _ in range(3))
    return 1000 * max(full - prefill, 0.0) / (tokens - 1)


def measure(model_folder: str, shape: ModelShape, *, device: str, prompt_tokens: int, decode_tokens: int = 64,
            batches: tuple[int, ...] = BATCHES, lengths: tuple[int, ...] = LENGTHS, micro_batch: int = 1,
            estimate_update: Callable[[int], float] | None = None) -> Measured:
    """``estimate_update(length)``: the estimate in bytes of the update at that completion
    length, set beside the peak."""
    import torch
    from transformers import AutoModelForCausalLM

    cuda = device != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = Measured(device, asdict(shape), prompt_tokens, decode_tokens, micro_batch)
    generator = torch.Generator().manual_seed(0)
    vocab = min(shape.vocab_size, 512)  # ids every tokenizer of the shape's family holds

    def random_ids(batch: int, length: int) -> Any:
        return torch.randint(1, vocab, (batch, length), generator=generator).to(device)

    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.bfloat16 if cuda else torch.float32)
    model.to(device).eval()
    with torch.no_grad():
        for batch in batches:
            ids = random_ids(batch, prompt_tokens)
            row: dict[str, float | str] = {}
            for cache in ("dynamic", "static"):
                try:
                    row[cache] = round(_decode_ms(model, ids, decode_tokens, sync, cache), 3)
                except Exception as exc:  # noqa: BLE001 - a cache this version or device lacks is a row's note
                    row[cache] = f"not available: {type(exc).__name__}: {str(exc)[:120]}"
            out.decode_ms[str(batch)] = row
    del model
    # The update as the trainer runs it: fp32 weights stepped by AdamW, bf16 autocast on a GPU.
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).to(device)
    # transformers 5.2x names it activation checkpointing; the training environment's 5.17 does not.
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def update(ids: Any) -> None:
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    for length in sorted(lengths):
        ids = random_ids(micro_batch, prompt_tokens + length)
        update(ids)  # warm-up
        optimizer.zero_grad(set_to_none=False)
        if cuda and length == max(lengths):
            torch.cuda.reset_peak_memory_stats()
        seconds = _timed(lambda: update(ids), sync)
        out.update_tokens_per_s[str(length)] = round(ids.numel() / seconds, 1)
    optimizer.step()  # Adam's moments made; the next step is the one timed
    out.optimizer_step_s = round(_timed(optimizer.step, sync), 4)
    if cuda:
        gib = 1024 ** 3
        out.peak_gib = round(torch.cuda.max_memory_allocated() / gib, 2)
        if estimate_update is not None:
            out.estimate_gib = round(estimate_update(max(lengths)) / gib, 2)
    return out


def report(measured: Measured, train_prompts: int, val_prompts: int, gpus: int) -> tuple[str, dict[str, Any]]:
    rows = ["| batch | dynamic cache (ms/step) | static cache (ms/step) |", "|---|---|---|"]
    for batch, caches in measured.decode_ms.items():
        cells = [f"{v:.2f}" if isinstance(v, float) else "-" for v in (caches.get("dynamic"), caches.get("static"))]
        rows.append(f"| {batch} | {cells[0]} | {cells[1]} |")
    rows += ["", "| completion tokens | update tokens/s |", "|---|---|"]
    rows += [f"| {n} | {v:.0f} |" for n, v in measured.update_tokens_per_s.items()]
    rows += ["", f"optimizer step: {measured.optimizer_step_s:.3f} s"]
    if measured.peak_gib is not None:
        err = measured.error_pct
        rows.append(f"peak of the update: {measured.peak_gib:.2f} GiB measured, {measured.estimate_gib} GiB estimated"
                    + ("" if err is None else f" ({err:+.1f} %)"))
    else:
        rows.append("peak memory: not measured on a CPU")
    projections = projection.sweep(measured.figures(), train_prompts, val_prompts, measured.prompt_tokens, gpus)
    assumptions = [
        f"{projection.SCHEDULE_EPOCHS} epochs over {train_prompts} training prompts, "
        f"{projection.PROMPTS_PER_STEP} prompts x {projection.COMPLETIONS_PER_PROMPT} completions a step",
        f"validation of {val_prompts} prompts every 100 steps; {gpus} GPU(s) sharing each step evenly",
        f"prompts of {measured.prompt_tokens} tokens; decode at a step's batch, update at the longest length measured",
        "rates of random weights (every completion to full length); no vLLM, no KL reference forward",
    ]
    rows += ["", projection.table(projections), ""] + [f"- {a}" for a in assumptions]
    data = {**asdict(measured), "error_pct": measured.error_pct, "figures": asdict(measured.figures()),
            "projection": [asdict(p) for p in projections], "assumptions": assumptions}
    return "\n".join(rows), data


def write(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def cmd(args: Any) -> int:
    import torch

    from embodied_r.backends.models import resolve_model
    from embodied_r.checks.gpu_policy import PROMPT_TOKENS, random_policy
    from embodied_r.config import load_recipe
    from embodied_r.paths import home
    from embodied_r.training import memory
    from embodied_r.training.shapes import shape_from_config, shape_of

    if not args.train_prompts:
        print("error: --measure projects a schedule over your training set: pass --train-prompts N (the rows of "
              "your records' train split)")
        return 2
    recipe = load_recipe(args.recipe)
    if args.policy_shape == "tiny":
        shape = shape_from_config(json.loads((Path(resolve_model("tiny:lm")) / "config.json").read_text()))
    elif (shape := shape_of(recipe.training.model)) is None:
        print(f"error: the shape of {recipe.training.model} is unknown here: put its config.json in the hub "
              "cache or pass a local folder as training.model")
        return 2
    device = "cpu" if args.device == "cpu" or not torch.cuda.is_available() else "cuda"
    if args.device != "cpu" and device == "cpu":
        print("error: no CUDA GPU here; `--device cpu` measures on the CPU (for the command's own check)")
        return 2
    folder = random_policy(shape, "measure" if args.policy_shape is None else "tiny-shape", device)
    prompt = args.prompt_tokens or PROMPT_TOKENS
    micro = args.micro_batch or recipe.training.per_device_train_batch_size

    def estimate_update(length: int) -> float:
        # One process, the micro-batch timed, the whole model trained (as the timed update is).
        training = recipe.training.model_copy(update={"per_device_train_batch_size": micro, "lora": None,
                                                      "accelerate_config": None})
        parts = memory.estimate(training, shape, prompt, length, gpus=1).parts
        return sum(parts.get(p, 0.0) for p in UPDATE_PARTS)

    measured = measure(folder, shape, device=device, prompt_tokens=prompt, decode_tokens=args.decode_tokens,
                       batches=tuple(args.batches), lengths=tuple(args.lengths), micro_batch=micro,
                       estimate_update=estimate_update)
    text, data = report(measured, args.train_prompts, args.val_prompts, args.projection_gpus)
    out = args.out or home() / "checks" / f"measure-{args.recipe}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    print(f"check gpu --measure: {args.recipe}'s policy shape on {device}, torch {torch.__version__}\n\n{text}\n")
    print(f"written: {write(Path(out), {'recipe': args.recipe, 'torch': torch.__version__, **data})}")
    return 0
