"""The GPU memory model term by term: each term against the library behaviour it follows,
every GPU recipe against the card it names, the launch's refusal, and DDP's gradient buckets
measured on a real model with two processes."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from embodied_r.config import load_recipe
from embodied_r.training import memory, shapes

SHAPE = shapes.KNOWN_SHAPES["Qwen/Qwen2.5-VL-3B-Instruct"]
PARAMS = SHAPE.parameters()
GPU_RECIPES = ("paper", "paper-8gpu", "paper-5gpu", "paper-16gpu", "official-script", "official-script-5gpu",
               "single-gpu", "improved", "released")


def paper(**update: object):
    return load_recipe("paper").training.model_copy(update=update)


def test_zero3_holds_16_bytes_a_parameter_and_20_at_the_step() -> None:
    eight = memory.estimate(load_recipe("paper-8gpu").training, SHAPE)
    held = eight.parts["policy"] + eight.parts["gradients"] + eight.parts["optimizer"]
    assert held == pytest.approx(16 * PARAMS / 8)  # bf16 weights and gradients, fp32 master and moments
    assert eight.parts["step_fp32_gradients"] == pytest.approx(4 * PARAMS / 8)
    assert eight.parts["ddp_buckets"] == 0 and eight.parts["autocast_copies"] == 0  # no DDP, 16-bit weights
    # ZeRO-3's flat gradient buffer is allocated with the optimizer: the rollout holds it too.
    assert eight.generation_peak == pytest.approx(sum(eight.parts[n] for n in
                                                      ("policy", "reference", "gradients", "optimizer", "gathered")))


def test_ddp_holds_its_buckets_beside_the_gradients_unless_they_are_views() -> None:
    one = memory.estimate(paper(ddp_gradient_as_bucket_view=False), SHAPE, 950, gpus=1)
    two = memory.estimate(paper(ddp_gradient_as_bucket_view=False), SHAPE, 950, gpus=2)
    views = memory.estimate(paper(ddp_gradient_as_bucket_view=True), SHAPE, 950, gpus=2)
    assert one.parts["ddp_buckets"] == 0  # one process: no DDP wrapper
    assert two.parts["ddp_buckets"] == two.parts["gradients"] == 4 * PARAMS
    assert views.parts["gradients"] == 0 and views.parts["ddp_buckets"] == 4 * PARAMS
    # The buckets live from the wrap on: the rollout holds them too.
    held = [est.generation_peak - est.parts["generation"] for est in (one, two)]  # 2 processes generate fewer
    assert held[1] - held[0] == 4 * PARAMS
    assert two.peak - views.peak == pytest.approx(4 * PARAMS)


def test_the_fused_head_is_charged_its_tiles_and_fp32_gradient_never_the_logits() -> None:
    est = memory.estimate(paper(), SHAPE)  # 8 completions of 2,048 tokens a micro-batch
    scored, vocab, hidden = 8 * 2048, SHAPE.vocab_size, SHAPE.hidden_size
    tile = 4096 * 32768 * 2  # bf16 under autocast
    backward = tile + scored * hidden * 4 + vocab * hidden * 4 + 32768 * hidden * 2
    assert est.parts["lm_head"] == backward
    assert est.parts["lm_head"] < scored * vocab * 2 / 2  # well below the full logits (4.6 GiB)


def test_autocast_copies_of_fp32_weights_are_counted_where_the_weights_are_fp32() -> None:
    assert memory.estimate(paper(), SHAPE).parts["autocast_copies"] == 2 * PARAMS
    assert memory.estimate(paper(bf16=False), SHAPE).parts["autocast_copies"] == 0  # no autocast at all


def test_vllm_share_holds_the_cache_the_recipe_needs_and_its_weights() -> None:
    est = memory.estimate(load_recipe("paper-8gpu").training, SHAPE)
    per_token = 2 * SHAPE.num_hidden_layers * SHAPE.kv_width * 2
    cache = 4 * 8192 * per_token  # 1 x 4 accumulation sequences of max_model_length
    assert cache / memory.GIB == pytest.approx(1.125)
    assert est.vllm_needs > cache + 2 * PARAMS + memory.VLLM_MARGIN
    assert est.vllm_needs < cache + 2 * PARAMS + memory.VLLM_MARGIN + 0.5 * memory.GIB
    assert memory.vllm_share(est, 39.6) == pytest.approx(0.25)
    short = memory.estimate(load_recipe("paper-8gpu", {"training": {"vllm": {"gpu_memory_utilization": 0.15}}}
                                        ).training, SHAPE)
    fits, why = memory.verdict(short, 39.6)
    assert not fits and "below the" in why


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_every_gpu_recipe_fits_its_card_at_the_benchmarks_prompts(name: str) -> None:
    training = load_recipe(name).training
    assert training.gpu_gib is not None
    fits, why = memory.verdict(memory.estimate(training, SHAPE, 950), training.gpu_gib)
    assert fits, why
    if training.vllm is not None:  # the ZeRO-3 recipes fit at their limits too
        assert memory.verdict(memory.estimate(training, SHAPE), training.gpu_gib)[0]


def test_paper_on_several_processes_fits_80gb_only_with_bucket_views() -> None:
    for world in (2, 4):
        line = memory.launch_refusal(paper(ddp_gradient_as_bucket_view=False), SHAPE, world, 79.6, 950, "paper")
        assert line is not None and "\n" not in line
        assert "141 GB (H200)" in line and "ddp_gradient_as_bucket_view: true" in line
        assert memory.launch_refusal(paper(), SHAPE, world, 79.6, 950, "paper") is None
    # At its own prompt limit no 80 GB card holds it, views or not.
    assert "needs a 141 GB (H200)" in memory.launch_refusal(paper(), SHAPE, 2, 79.6, 6144, "paper")


def test_the_0_5b_measurement_stays_within_its_estimate() -> None:
    est = memory.estimate(paper(), shapes.KNOWN_SHAPES["Qwen/Qwen2.5-0.5B-Instruct"], 950, 512)
    assert est.peak / memory.GIB == pytest.approx(11.7, rel=0.03)  # measured on an H200


def test_check_memory_says_fits_or_not_and_names_the_largest_terms(capsys: pytest.CaptureFixture[str]) -> None:
    from embodied_r.checks.gpu import cmd_memory

    cmd_memory(argparse.Namespace(recipe=["paper", "paper-8gpu"], prompt_tokens=950, gpus=2, gpu_gib=39.6))
    verdicts = capsys.readouterr().out.split("\n\n")[1].splitlines()
    assert verdicts[0].startswith("paper: does not fit: ") and "largest: optimizer 23.0" in verdicts[0]
    assert verdicts[0].endswith("needs a 80 GB (A100, A800, H100) card")
    assert verdicts[1].startswith("paper-8gpu: fits: ")


def test_the_trainer_asks_ddp_for_bucket_views_when_told(tmp_path: Path) -> None:
    from accelerate.utils import DistributedDataParallelKwargs
    from transformers import TrainingArguments

    from embodied_r.training.chain import trainer_class

    def handlers(view: bool) -> list:
        cls = trainer_class(None, None, bucket_view=view)
        trainer = object.__new__(cls)
        trainer.model = object()
        trainer.args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[],
                                         ddp_find_unused_parameters=False)
        return [h for h in trainer._build_accelerator_args()["kwargs_handlers"]
                if isinstance(h, DistributedDataParallelKwargs)]

    assert [h.gradient_as_bucket_view for h in handlers(True)] == [True]
    assert [h.gradient_as_bucket_view for h in handlers(False)] == [False]


def test_a_launch_refuses_on_a_card_too_small_for_its_longest_prompt(tiny_lm_path: Path) -> None:
    from datasets import Dataset

    from embodied_r.training.grpo import memory_refusal

    training = paper(policy=str(tiny_lm_path), vllm=None)
    short = [{"role": "user", "content": "left or right?"}]
    long = [{"role": "user", "content": "left or right? " * 400}]
    data = Dataset.from_list([{"prompt": short}, {"prompt": long}])
    assert memory_refusal(training, str(tiny_lm_path), data, 1, None) is None  # no GPU found
    line = memory_refusal(training, str(tiny_lm_path), data, 1, 0.05, "tiny")
    assert line is not None and line.startswith("tiny on 1 process(es) with ")
    tokens = int(line.split(" with ")[1].split("-token")[0])
    assert tokens > 400  # the longest prompt, not the first
    assert memory_refusal(training, str(tiny_lm_path), data, 1, 80.0) is None


# --- DDP's buckets, measured ----------------------------------------------------------------

TINY = shapes.ModelShape(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128)


def _gradient_bytes(rank: int, world: int, port: int, out: object) -> None:
    """Bytes held for gradients after one backward under DDP, without and with bucket views:
    the distinct storages of DDP's buckets (as its communication hook sees them) and of every
    parameter's gradient."""
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from transformers import Qwen2Config, Qwen2ForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for view in (False, True):
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(Qwen2Config(**TINY.config_kwargs()))
            ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=view)
            storages: dict[int, int] = {}

            def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses any annotation but GradBucket
                storage = bucket.buffer().untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
                return allreduce_hook(state, bucket)

            ddp.register_comm_hook(None, hook)
            ids = torch.randint(0, TINY.vocab_size, (2, 16))
            ddp(input_ids=ids, labels=ids).loss.backward()
            for p in model.parameters():
                storages[p.grad.untyped_storage().data_ptr()] = p.grad.untyped_storage().nbytes()
            out.put((rank, view, sum(storages.values())))
        dist.barrier()  # neither rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def test_ddp_gradient_bytes_measured_on_two_processes_match_the_estimate() -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_gradient_bytes, args=(rank, 2, port, out)) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        measured = [out.get(timeout=120) for _ in range(4)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.exitcode is None:
                p.terminate()
    for view in (False, True):
        est = memory.estimate(paper(bf16=False, ddp_gradient_as_bucket_view=view), TINY, 16, 16, gpus=2)
        assert {b for _, v, b in measured if v is view} == {est.parts["gradients"] + est.parts["ddp_buckets"]}


# --- GPU-hours of the schedule, from given figures ------------------------------------------


def test_projection_prices_the_three_stages_from_per_token_figures() -> None:
    from embodied_r.checks.projection import Figures, project, sweep, table

    figures = Figures(decode_ms_per_step=20.0, update_tokens_per_s=16_000.0, optimizer_step_s=1.0)
    p = project(figures, train_prompts=1000, val_prompts=64, prompt_tokens=950, completion_tokens=500)
    assert p.steps == 3000  # 1,000 prompts x 12 epochs / 4 prompts a step
    # 500 tokens x 20 ms decoding, 32 x 1,450 tokens at 16,000 a second, 1 s optimizer step
    assert p.seconds_per_step == pytest.approx(10.0 + 2.9 + 1.0)
    assert p.eval_seconds == pytest.approx(30 * 2 * 10.0)  # every 100 steps, 64 prompts in 2 rounds
    assert p.gpu_hours == pytest.approx((3000 * 13.9 + 600) / 3600)
    on_eight = project(figures, 1000, 64, 950, 500, gpus=8)
    assert on_eight.gpu_hours == pytest.approx(p.gpu_hours)  # the same work spread over more cards
    assert on_eight.seconds_per_step == pytest.approx(p.seconds_per_step / 8)
    rows = sweep(figures, 1000, 64, 950)
    assert [r.completion_tokens for r in rows] == [300, 512, 1024, 1536, 2048]
    assert all(a.gpu_hours < b.gpu_hours for a, b in zip(rows, rows[1:]))
    assert table(rows).splitlines()[2].startswith("| 300 | 3000 | ")
