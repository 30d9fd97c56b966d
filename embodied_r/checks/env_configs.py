"""The config half of the training-environment check, run in the training environment
(``python -m embodied_r.checks.env_configs CASES.json OUT.json``): each case's GRPO and SFT
configs built by the project's own functions at a faked world size, and checked to mean there
what the project meant (keywords, values, batch, precision, the launch)."""

from __future__ import annotations

import contextlib
import enum
import json
import math
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

from embodied_r.backends.base import BackendConfig
from embodied_r.checks.steps import ask_reference, timed_row


@contextlib.contextmanager
def faked(world: int, env: dict[str, str], gpus: int = 0) -> Iterator[None]:
    """``world`` processes, a bf16-capable GPU, and ``env`` set, for the duration."""
    import torch
    import transformers.training_args as ta
    from transformers import TrainingArguments

    REAL_CUDA.setdefault("is_available", torch.cuda.is_available)
    REAL_CUDA.setdefault("device_count", torch.cuda.device_count)
    saved_env = dict(os.environ)
    saved = (TrainingArguments.world_size, ta.is_torch_bf16_gpu_available, torch.cuda.is_available,
             torch.cuda.device_count, torch.cuda.is_bf16_supported, torch.accelerator.current_accelerator)
    TrainingArguments.world_size = property(lambda self: world)
    ta.is_torch_bf16_gpu_available = lambda: True
    # The project asks for native bf16 (embodied_r.backends.devices): the faked GPU has it.
    torch.cuda.is_bf16_supported = lambda including_emulation=True: True
    if gpus:
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: gpus
        # accelerate 1.16 finds the GPUs through torch.accelerator before it asks torch.cuda.
        torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cuda")
    os.environ.update(env)
    try:
        yield
    finally:
        (TrainingArguments.world_size, ta.is_torch_bf16_gpu_available, torch.cuda.is_available,
         torch.cuda.device_count, torch.cuda.is_bf16_supported, torch.accelerator.current_accelerator) = saved
        os.environ.clear()
        os.environ.update(saved_env)


REAL_CUDA: dict[str, Any] = {}


@contextlib.contextmanager
def real_cuda() -> Iterator[None]:
    """The real ``torch.cuda`` probes, inside a ``faked(gpus=...)``."""
    import torch

    faked_now = (torch.cuda.is_available, torch.cuda.device_count)
    torch.cuda.is_available, torch.cuda.device_count = REAL_CUDA["is_available"], REAL_CUDA["device_count"]
    try:
        yield
    finally:
        torch.cuda.is_available, torch.cuda.device_count = faked_now


def launch_plan(cmd: list[str], gpus: int) -> dict[str, Any]:
    """What ``accelerate launch`` makes of ``cmd``: launcher, process count and environment.
    The launchers are replaced by recorders; nothing starts."""
    import accelerate.commands.launch as launch
    from accelerate.utils import launch as prepare

    seen: dict[str, Any] = {}

    def recorder(kind: str, build: Any) -> Any:
        def record(args: Any) -> None:
            out = build(args)
            seen.update(kind=kind, env=out[1] if isinstance(out, tuple) else out, args=args)
        return record

    originals = (launch.deepspeed_launcher, launch.multi_gpu_launcher, launch.simple_launcher)
    launch.deepspeed_launcher = recorder("deepspeed", prepare.prepare_deepspeed_cmd_env)
    launch.multi_gpu_launcher = recorder("multi_gpu", prepare.prepare_multi_gpu_env)
    launch.simple_launcher = recorder("simple", prepare.prepare_simple_launcher_cmd_env)
    try:
        start = cmd.index("accelerate.commands.launch") + 1
        with faked(1, {}, gpus=gpus):
            launch.launch_command(launch.launch_command_parser().parse_args(cmd[start:]))
    finally:
        launch.deepspeed_launcher, launch.multi_gpu_launcher, launch.simple_launcher = originals
    args = seen["args"]
    # On several nodes each launcher starts its node's share; the world is all of them.
    nodes = int(getattr(args, "nnodes", None) or 1)
    per_node = int(getattr(args, "nproc_per_node", None) or args.num_processes or 1)
    env = {k: v for k, v in seen["env"].items() if k.startswith("ACCELERATE_")}
    return {"launcher": seen["kind"], "processes": per_node * nodes, "env": env, "nodes": nodes,
            "per_node": per_node, "node_rank": int(getattr(args, "node_rank", None) or 0),
            # torchrun's static rendezvous meets at rdzv_endpoint, else at master_addr:port.
            "master": getattr(args, "rdzv_endpoint", None)
            or f"{getattr(args, 'master_addr', None)}:{getattr(args, 'master_port', None)}"}


# A documentation address (RFC 5737): the main node's, as the cluster would set it.
MAIN_ADDR = "192.0.2.10"


def check_nodes(cmd: list[str], first: dict[str, Any], world: int, gpus: int) -> list[str]:
    """The main node's launch and every other node's, as ``follow_launches.py`` replays it, meet
    at the main node's address, each starting its share of the world."""
    from embodied_r.training.multinode import for_rank

    problems = []
    plans = [first] + [launch_plan(for_rank(cmd, rank), gpus) for rank in range(1, first["nodes"])]
    for rank, plan in enumerate(plans):
        where = f"node {rank}"
        if plan["node_rank"] != rank:
            problems.append(f"{where}: launched as node rank {plan['node_rank']}")
        if not plan["master"].startswith(f"{MAIN_ADDR}:") or plan["master"] != first["master"]:
            problems.append(f"{where}: meets at {plan['master']}, not the main node {MAIN_ADDR}")
        if plan["per_node"] * len(plans) != world or plan["launcher"] != first["launcher"]:
            problems.append(f"{where}: {plan['launcher']} with {plan['per_node']} processes, "
                            f"not {world // len(plans)} of {world}")
    return problems


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _same(built: Any, passed: Any) -> bool:
    built, passed = _plain(built), _plain(passed)
    if isinstance(passed, float) or isinstance(built, float):
        try:
            return math.isclose(float(built), float(passed), rel_tol=1e-9, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    return built == passed


def accumulation_of(cfg: Any, world: int) -> int:
    """GRPO derives the accumulation from completions_per_step; SFT gives it."""
    derive = getattr(cfg, "accumulation_steps", None)
    return derive(world) if derive is not None else cfg.gradient_accumulation_steps


@contextlib.contextmanager
def deprecations() -> Iterator[list[str]]:
    """The deprecation warnings given inside the block (filled at its end): a renamed argument
    passed by its old name warns only there (TRL's default for the old name warns unless the new
    one is passed)."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield found
    found += [f"{w.category.__name__}: {w.message}" for w in caught
              if issubclass(w.category, (DeprecationWarning, FutureWarning))]


def check_args(args: Any, kwargs: dict[str, Any], cfg: Any, world: int, deepspeed: bool) -> list[str]:
    problems = [f"{k}: passed {v!r}, reads back {_plain(getattr(args, k, None))!r}"
                for k, v in kwargs.items() if not _same(getattr(args, k, None), v)]
    accumulation = accumulation_of(cfg, world)
    per_step = world * cfg.per_device_train_batch_size * accumulation
    if hasattr(args, "generation_batch_size") and "generation_batch_size" not in kwargs \
            and "steps_per_generation" not in kwargs:
        if args.generation_batch_size != per_step:
            problems.append(f"generation_batch_size {args.generation_batch_size}, meant {world} processes x "
                            f"{cfg.per_device_train_batch_size} x {accumulation} = {per_step}")
        if args.generation_batch_size % args.num_generations:
            problems.append(f"{args.generation_batch_size} completions per step: not whole groups of "
                            f"{args.num_generations}")
    if bool(args.gradient_checkpointing) != cfg.gradient_checkpointing:
        problems.append(f"gradient checkpointing {args.gradient_checkpointing}, configured {cfg.gradient_checkpointing}")
    warmup = getattr(cfg, "warmup_ratio", None)
    if warmup is not None and args.get_warmup_steps(1000) != math.ceil(warmup * 1000):
        problems.append(f"warm-up of {args.get_warmup_steps(1000)} steps in 1000, meant a share of {warmup}")
    dtype = (args.model_init_kwargs or {}).get("dtype") if hasattr(args, "model_init_kwargs") else None
    if dtype in ("bfloat16", "bf16") and not (deepspeed or cfg.lora is not None):
        problems.append("bf16 weights under a plain AdamW (no DeepSpeed, no LoRA): updates round away; "
                        "load fp32 and train bf16 as mixed precision")
    if args.bf16 != bool(args.bf16) or (cfg.use_cpu and args.bf16):
        problems.append(f"bf16 {args.bf16!r} on use_cpu={cfg.use_cpu}")
    return problems


def check_deepspeed(args: Any, launch: dict[str, Any], world: int, cfg: Any) -> list[str]:
    """The launch's DeepSpeed JSON, its ``auto`` values resolved as the Trainer resolves them
    (a 2048-wide model stands in)."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    problems = []
    env = launch["env"]
    if env.get("ACCELERATE_USE_DEEPSPEED") != "true":
        problems.append(f"accelerate launch does not turn DeepSpeed on: {env}")
    path = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if not path or not Path(path).is_file():
        return problems + [f"DeepSpeed config {path!r} is not a file"]
    if getattr(args, "deepspeed_plugin", None) is None:
        problems.append("the trainer's arguments carry no DeepSpeed plugin under the launch's environment")
    ds = HfTrainerDeepSpeedConfig(path)
    ds.trainer_config_process(args)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=2048))
    ds.trainer_config_finalize(args, model, num_training_steps=100)
    conf = ds.config
    left = [k for k, v in _flat(conf) if v == "auto"]
    if left:
        problems.append(f"DeepSpeed values left 'auto': {left}")
    want = world * cfg.per_device_train_batch_size * accumulation_of(cfg, world)
    if conf.get("train_batch_size") != want:
        problems.append(f"DeepSpeed train_batch_size {conf.get('train_batch_size')}, meant {want}")
    if bool(conf.get("bf16", {}).get("enabled")) != bool(args.bf16):
        problems.append(f"DeepSpeed bf16 {conf.get('bf16')}, trainer bf16 {args.bf16}")
    return problems


def _flat(data: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _flat(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), data


def _recording(build: Any, recorded: dict[str, Any]) -> Any:
    def wrapper(cls: type, kwargs: dict[str, Any]) -> Any:
        recorded.clear()
        recorded.update(kwargs)
        with real_cuda():  # the project decided as on a GPU; the config builds on this CPU
            return build(cls, kwargs)
    return wrapper


def _launch(cfg: Any, work: Path, world: int, gpus: int, problems: list[str]) -> dict[str, Any]:
    """The launch ``cfg`` builds, its problems appended to ``problems``."""
    if cfg.launcher != "accelerate":
        return {"launcher": "python", "processes": 1, "env": {}}
    from embodied_r.training.multinode import MAIN_ADDR_ENV

    from unittest import mock

    with mock.patch.dict(os.environ, {MAIN_ADDR_ENV: MAIN_ADDR}):
        cmd = cfg.command("embodied_r.training.grpo", work / "spec.json")
    launch = launch_plan(cmd, gpus)
    if launch["processes"] != world:
        problems.append(f"accelerate launch starts {launch['processes']} processes, expected {world}")
    if launch["nodes"] > 1:
        problems += check_nodes(cmd, launch, world, gpus)
    return launch


def _build_problems(build: Any, owner: Any, recorded: dict[str, Any], world: int, gpus: int,
                    launch: dict[str, Any], deepspeed: bool) -> list[str]:
    try:
        # A GPU recipe is built as on its GPUs (bf16 left to the default turns on there).
        with faked(world, launch["env"], gpus=0 if owner.use_cpu else max(gpus, world)):
            with deprecations() as deprecated:
                args = build()
            problems = check_args(args, dict(recorded), owner, world, deepspeed) + deprecated
            if deepspeed:
                problems += check_deepspeed(args, launch, world, owner)
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        problems = [f"{type(exc).__name__}: {exc}"]
        if not isinstance(exc, (TypeError, ValueError)):
            problems.append(traceback.format_exc(limit=4))
    return problems


def run_case(case: dict[str, Any], work: Path) -> dict[str, Any]:
    # Imported before any build: a library's warnings at import are not about the arguments passed.
    from trl import GRPOConfig, SFTConfig as TRLSFTConfig  # noqa: F401

    from embodied_r.training import grpo, sft_child
    from embodied_r.training.config import SFTConfig, TrainingConfig

    started = time.monotonic()
    world = int(case["world"])
    gpus = int(case.get("gpus") or 0)
    result: dict[str, Any] = {"recipe": case["recipe"], "world": world, "built": [], "problems": [],
                              "planted": bool(case.get("planted"))}
    recorded: dict[str, Any] = {}
    cfg = TrainingConfig.model_validate(case["training"])
    # A case that must refuse its GRPO batch shape carries no SFT config: nothing may build.
    sft = SFTConfig.model_validate(case["sft"]) if case.get("sft") else None
    launch = _launch(cfg, work, world, gpus, result["problems"])
    result["launch"] = {k: launch[k] for k in ("launcher", "processes")}
    if launch.get("nodes", 1) > 1:
        result["launch"]["nodes"] = launch["nodes"]
    deepspeed = launch["launcher"] == "deepspeed"
    if deepspeed != cfg.deepspeed():
        result["problems"].append(f"launcher {launch['launcher']}, but the config says DeepSpeed={cfg.deepspeed()}")
    originals = (grpo.build_config, sft_child.build_config)
    grpo.build_config = _recording(grpo.build_config, recorded)
    sft_child.build_config = _recording(sft_child.build_config, recorded)
    try:
        builds: list[tuple[str, Any, Any]] = [(stage.name, cfg, lambda s=stage: grpo.grpo_args(
            s, cfg, work, grpo.reward_setup(s, cfg)[1], [], world)) for stage in cfg.stages]
        if sft is not None:
            builds.append(("sft", sft, lambda: sft_child.sft_args(sft, work, [])))
        for name, owner, build in builds:
            problems = _build_problems(build, owner, recorded, world, gpus, launch, deepspeed)
            if problems:
                result["problems"] += [f"{name}: {p}" for p in problems]
            else:
                result["built"].append(name)
    finally:
        grpo.build_config, sft_child.build_config = originals
    result["expected"] = [s.name for s in cfg.stages] + (["sft"] if sft is not None else [])
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def check_pad_guard(work: Path) -> list[str]:
    """The tiny LM passes the pad-token guard; saved as SmolLM2's GGUF conversion left it under
    transformers 5.17 (eos ``<|im_start|>``, no pad token: trainers would pad with the token that
    begins every chat turn), it must be refused, naming the folder and the fix."""
    import shutil

    from transformers import AutoTokenizer

    from embodied_r.backends.models import resolve_model
    from embodied_r.backends.tokens import check_folder_pad
    from embodied_r.errors import PadTokenError

    tiny = Path(resolve_model("tiny:lm"))
    check_folder_pad(str(tiny))
    planted = work / "im-start-eos"
    shutil.rmtree(planted, ignore_errors=True)
    shutil.copytree(tiny, planted)
    tokenizer = AutoTokenizer.from_pretrained(planted)
    tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
    tokenizer.save_pretrained(planted)
    try:
        check_folder_pad(str(planted))
    except PadTokenError as exc:
        return [] if str(planted) in str(exc) and "<|endoftext|>" in str(exc) else [
            f"the refusal names neither the folder nor the fix: {exc}"]
    return ["a folder whose eos (and so its padding) is <|im_start|> was not refused"]


def main(cases_path: str, out_path: str) -> int:
    import logging

    logging.disable(logging.WARNING)
    spec = json.loads(Path(cases_path).read_text())
    work = Path(out_path).parent / "config-work"
    work.mkdir(parents=True, exist_ok=True)
    out = {"configs": [run_case(case, work) for case in spec["cases"]]}
    if spec.get("reference"):
        reference = BackendConfig.model_validate(spec["reference"])
        out["reference"] = timed_row("smoke", "consistency reward asks its reference", 1,
                                     lambda: ask_reference(reference)["problems"])
    out["pad"] = timed_row("smoke", "pad token: a chat-template token refused", 1, lambda: check_pad_guard(work))
    Path(out_path).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
