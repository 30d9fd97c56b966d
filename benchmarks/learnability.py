"""What can the demo's tiny reasoner learn? Test accuracy against training, per design.

Trains the demo's reasoner on the demo's own GRPO records, in this process (no Prefect, no
MLflow), with the trainers the pipeline uses (TRL's SFT for the warm start, TRL's GRPO), and
measures test accuracy by greedy decoding as it goes: against examples seen for the warm
start, against completions sampled for GRPO. Each variant changes one thing of the design:

- the warm start's trace: ``answer`` (the answer and the start of its option) or ``fact`` (the
  perception words that decide the question, then the option they point to);
- the benchmark's options: ``shuffled`` as the real benchmarks, or ``fixed`` (each closed set
  of answers in one order) with the right answers ``balanced`` so no letter is a free win;
- the reasoner's width and depth;
- GRPO's learning rate, group size and KL weight.

The benchmark, key frames and perception are made once per option design in ``--home``
(the demo recipe's stages, run by the library); each variant then takes a minute or two on
two cores. It prints one table: accuracy after each share of the warm start and of GRPO,
beside chance, the letter floor (each task's commonest train letter, text unread) and the
ceiling (a scripted reader of the perception text), then per-task accuracy at the end.

    python benchmarks/learnability.py                          # every variant, seed 42
    python benchmarks/learnability.py --variants fact-fixed fact-fixed-h128 --seeds 42 1 2
    python benchmarks/learnability.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass(frozen=True)
class Variant:
    order: str = "fixed"  # the synthetic benchmark's option_order
    balanced: bool = True
    trace: str = "fact"  # the warm start's trace
    facts: int = 1  # objects a "positions" fact quotes
    hidden: int = 96
    layers: int = 3
    sft_epochs: float = 1.0
    sft_lr: float = 1e-2
    # Loss on every token (the prompt too): language modelling on the perception text beside
    # the traces, rather than on the completion only.
    whole_text: bool = False
    # Prompts cut to their last this many tokens (training.max_prompt_length), in training and
    # at test time: the last frames, the question and its options. None: whole prompts.
    prompt_tokens: int | None = None
    # The reasoner's tokenizer keeps the world's names whole (things, places, movements).
    words: bool = False
    # Further settings of the synthetic benchmark (more questions: more clips per flight).
    synthetic: dict[str, Any] = field(default_factory=dict)
    grpo_steps: int = 0  # 0: the warm start alone
    grpo_lr: float = 3e-4
    generations: int = 4
    prompts_per_step: int = 2
    beta: float = 0.001
    temperature: float = 1.0
    completion_tokens: int = 64
    note: str = ""
    grpo: dict[str, Any] = field(default_factory=dict)  # further TrainingConfig fields


# Every row below changes one thing of READ: the previous demo's benchmark size (120 clips of 60
# flights, 40 room scans), the trace quoting the deciding words, options in one order with
# balanced answers, the world's names as single tokens, prompts cut to their last 160 tokens
# (the last frames, the question, the options), eight passes over the train split.
READ = Variant(trace="fact", prompt_tokens=160, sft_epochs=8.0, words=True,
               synthetic={"urban_videos": 120, "clips_per_scene": 2})
ANSWER = dict(trace="answer", completion_tokens=24)
# Four times the flights' questions (four clips cut from each of twice the flights), half the passes.
MORE = replace(READ, sft_epochs=4.0, synthetic={"urban_videos": 480, "clips_per_scene": 4})
# The same at a third of the learning rate: the design the demo takes.
CHOSEN = replace(MORE, sft_lr=3e-3)
# GRPO as the demo runs it: from a warm start of one and a half passes, 180 steps of four
# questions with four completions each.
GRPO = replace(CHOSEN, sft_epochs=1.5, grpo_steps=180, prompts_per_step=4)
VARIANTS: dict[str, Variant] = {
    # The trace and the options.
    "answer-shuffled": replace(READ, order="shuffled", balanced=False, **ANSWER,
                               note="the previous demo's benchmark and traces"),
    "answer-shuffled-bal": replace(READ, order="shuffled", **ANSWER),
    "fact-shuffled-bal": replace(READ, order="shuffled"),
    "answer-fixed-bal": replace(READ, **ANSWER),
    "fact-fixed-bal": READ,
    # What the reasoner reads and how it is taught.
    "whole-prompt-3ep": replace(READ, prompt_tokens=None, sft_epochs=3.0, note="whole prompts, as the demo"),
    "cut256": replace(READ, prompt_tokens=256),
    "bpe-names": replace(READ, words=False, note="names split into word pieces"),
    "lm-loss": replace(READ, whole_text=True, note="loss on the prompt too"),
    "16ep": replace(READ, sft_epochs=16.0),
    "4x-questions": MORE,
    # The demo's design: four times the questions at a third of the learning rate.
    "4x-lr3e-3": CHOSEN,
    # Width and depth, on the demo's design.
    "h128": replace(CHOSEN, hidden=128),
    "h192": replace(CHOSEN, hidden=192),
    "l2": replace(CHOSEN, layers=2),
    "l4": replace(CHOSEN, layers=4),
    # GRPO (stage 2's weights, 180 steps as the demo's three stages of 60) after a two-pass
    # warm start: learning rate, prompts per step; then after one and a half passes (the demo's),
    # group size and KL.
    "grpo-chosen": replace(CHOSEN, sft_epochs=2.0, grpo_steps=180),
    "grpo-chosen-lr1e-3": replace(CHOSEN, sft_epochs=2.0, grpo_steps=180, grpo_lr=1e-3),
    "grpo-chosen-p4": replace(CHOSEN, sft_epochs=2.0, grpo_steps=180, prompts_per_step=4),
    "grpo-chosen-1.5ep-p4": GRPO,
    "grpo-1.5ep-g8": replace(GRPO, generations=8, prompts_per_step=2),
    "grpo-1.5ep-beta0.04": replace(GRPO, beta=0.04),
}
SHARES = (0.25, 0.5, 0.75, 1.0)  # of each phase, where accuracy is measured


def prepare(home: Path, v: Variant) -> dict[str, Path]:
    """The demo's stages up to convert for the variant's option design (made once)."""
    from embodied_r.config import load_recipe
    from embodied_r.pipeline import execute, plan

    overrides = {"download": {"synthetic": {"option_order": v.order, "balanced": v.balanced, **v.synthetic}}}
    stages = plan(load_recipe("demo", overrides), home)
    for name in ("download", "preprocess", "keyframes", "perception", "convert"):
        execute(stages[name])
    return {"records": Path(stages["convert"].out), "catalog": Path(stages["preprocess"].out) / "catalog.parquet",
            "perception": Path(stages["perception"].out)}


def reasoner(home: Path, v: Variant) -> str:
    from embodied_r.demo.tiny_models import ensure_tiny_lm
    from embodied_r.demo.tiny_reasoner import reasoner_spec

    spec = reasoner_spec(reading=True).model_copy(update={
        "hidden_size": v.hidden, "intermediate_size": 2 * v.hidden, "num_hidden_layers": v.layers,
        **({} if v.words else {"words": ()})})
    return str(ensure_tiny_lm(home / "models", spec))


class Evaluator:
    """Greedy test accuracy of a model in training, overall and per task."""

    def __init__(self, records: Path, model: str, max_new_tokens: int, split: str = "test",
                 prompt_tokens: int | None = None):
        import pyarrow.parquet as pq

        from embodied_r.training.policy import load_tokenizer
        from embodied_r.training.records import conversation

        self.rows = pq.read_table(records / f"{split}.parquet").to_pylist()
        self.tok = load_tokenizer(model)
        self.prompts = [self.tok.apply_chat_template(conversation(r), add_generation_prompt=True, tokenize=False)
                        for r in self.rows]
        if prompt_tokens:
            from embodied_r.backends.truncation import left_truncate

            self.prompts, _ = left_truncate(self.prompts, self.tok, prompt_tokens)
        self.max_new_tokens = max_new_tokens

    def __call__(self, model: Any, batch: int = 48) -> dict[str, Any]:
        import torch

        from embodied_r.scoring.rewards import accuracy_reward, format_reward
        from embodied_r.training.traces import quote, read_fact

        was_training = model.training
        model.eval()
        texts: list[str] = []
        self.tok.padding_side = "left"
        with torch.no_grad():
            for i in range(0, len(self.prompts), batch):
                enc = self.tok(self.prompts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
                out = model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                     pad_token_id=self.tok.pad_token_id)
                texts += self.tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        if was_training:
            model.train()
        cols = {k: [r[k] for r in self.rows] for k in ("answer_type", "options")}
        scores = accuracy_reward(texts, [r["solution"] for r in self.rows], **cols)
        by_task: dict[str, list[float]] = {}
        quoted: dict[str, list[float]] = {}  # the deciding words quoted right, per task
        for r, s, text in zip(self.rows, scores, texts):
            by_task.setdefault(r["category"], []).append(s)
            fact = read_fact(r)
            if fact is not None:
                quoted.setdefault(r["category"], []).append(float(quote(fact, r["prompt"]) in text))
        mean = lambda d: {k: sum(v) / len(v) for k, v in sorted(d.items())}  # noqa: E731
        return {"accuracy": sum(scores) / len(scores), "format": sum(format_reward(texts)) / len(texts),
                "by_task": mean(by_task), "quoted": mean(quoted), "sample": texts[:2]}


def _callback(evaluate: Evaluator, total_steps: int, points: list[dict], per_step: int, unit: str) -> Any:
    from transformers import TrainerCallback

    marks = sorted({max(1, round(total_steps * s)) for s in SHARES})

    class Measure(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001
            if state.global_step in marks:
                found = evaluate(model)
                points.append({"step": state.global_step, unit: state.global_step * per_step, **found})

    return Measure()


def warm_start(v: Variant, seed: int, paths: dict[str, Path], model: str, work: Path,
               evaluate: Evaluator) -> tuple[str, list[dict], float]:
    import pyarrow.parquet as pq
    from datasets import Dataset
    from trl import SFTTrainer

    from embodied_r.training.policy import load_tokenizer
    from embodied_r.training.sft_child import sft_args, sft_examples
    from embodied_r.training.warmstart import traces
    from embodied_r.training.config import WarmstartConfig

    cfg = WarmstartConfig(use_cpu=True, gradient_checkpointing=False, epochs=v.sft_epochs, learning_rate=v.sft_lr,
                          warmup_ratio=0.1, per_device_train_batch_size=4, gradient_accumulation_steps=1,
                          max_length=8192, save_steps=10**6, seed=seed, trace=v.trace, max_actions=0,
                          max_objects=0 if v.trace == "answer" else v.facts, reference_examples=False,
                          sft_args={"completion_only_loss": False} if v.whole_text else {})
    rows = pq.read_table(paths["records"] / "train.parquet").to_pylist()
    examples = sft_examples(traces(rows, cfg), cfg.think)
    if v.prompt_tokens:
        from embodied_r.backends.truncation import limit_prompts

        limit_prompts(examples, model, v.prompt_tokens)
        # Text prompts want text completions (TRL appends the end-of-turn token itself).
        for e in examples:
            if isinstance(e["prompt"], str):
                e["completion"] = e["completion"][0]["content"]
    data = Dataset.from_list([{k: e[k] for k in ("prompt", "completion")} for e in examples])
    steps = int(-(-len(examples) * v.sft_epochs // 4))
    points: list[dict] = []
    trainer = SFTTrainer(model=model, args=sft_args(cfg, work, []), train_dataset=data,
                         processing_class=load_tokenizer(model),
                         callbacks=[_callback(evaluate, steps, points, 4, "examples")])
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    out = work / "model"
    trainer.save_model(str(out))
    trainer.processing_class.save_pretrained(str(out))
    return str(out), points, seconds


def grpo(v: Variant, seed: int, paths: dict[str, Path], model: str, work: Path,
         evaluate: Evaluator) -> tuple[list[dict], float]:
    from trl import GRPOTrainer

    from embodied_r.config import load_recipe
    from embodied_r.training.config import GRPOStageConfig, TrainingConfig
    from embodied_r.training.grpo import grpo_args, load_dataset, reward_setup
    from embodied_r.training.learning import quarter_stats

    per_step = v.generations * v.prompts_per_step
    base = load_recipe("demo").training.model_dump(mode="json")
    cfg = TrainingConfig.model_validate({**base, "learning_rate": v.grpo_lr, "num_generations": v.generations,
                                         "per_device_train_batch_size": per_step, "gradient_accumulation_steps": 1,
                                         "beta": v.beta, "temperature": v.temperature, "seed": seed,
                                         "max_completion_length": v.completion_tokens, "save_steps": 10**6,
                                         "max_steps_per_stage": v.grpo_steps, "max_prompt_length": v.prompt_tokens,
                                         **v.grpo})
    # Stage 2's weights: accuracy first, the format kept.
    stage = GRPOStageConfig(name="learnability", epochs=100, rewards={"format": 0.3, "accuracy": 0.7})
    funcs, weights = reward_setup(stage, cfg)
    points: list[dict] = []
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=grpo_args(stage, cfg, work, weights, []),
                          train_dataset=load_dataset(paths["records"], v.prompt_tokens, model),
                          callbacks=[_callback(evaluate, v.grpo_steps, points, per_step, "completions")])
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    # The pipeline's own first- and last-quarter figures, under the keys TRL logs them by.
    stats = quarter_stats(trainer.state.log_history, ["accuracy_reward"])
    for key, name in (("frac_reward_zero_std", "zero_std_groups"), ("entropy", "entropy"),
                      ("rewards/accuracy_reward/mean", "accuracy_reward")):
        if stats[name]["first"] is not None:
            points[-1][key] = (stats[name]["first"], stats[name]["last"])
    return points, seconds


def run_variant(name: str, v: Variant, seed: int, home: Path) -> dict[str, Any]:
    from transformers import set_seed

    from embodied_r.demo.ceiling import ceiling

    paths = prepare(home, v)
    top = ceiling(paths["catalog"], paths["perception"])
    model = reasoner(home, v)
    work = Path(tempfile.mkdtemp(prefix=f"{name}-{seed}-", dir=home))
    evaluate = Evaluator(paths["records"], model, v.completion_tokens, prompt_tokens=v.prompt_tokens)
    set_seed(seed)
    start = evaluate(__import__("transformers").AutoModelForCausalLM.from_pretrained(model))
    warmed, sft_points, sft_s = warm_start(v, seed, paths, model, work / "sft", evaluate)
    grpo_points, grpo_s = grpo(v, seed, paths, warmed, work / "grpo", evaluate) if v.grpo_steps else ([], 0.0)
    return {"variant": name, "seed": seed, "chance": top["chance"], "floor": top["prior"], "ceiling": top["accuracy"],
            "untrained": start["accuracy"], "sft": sft_points, "grpo": grpo_points,
            "seconds": {"sft": round(sft_s, 1), "grpo": round(grpo_s, 1)}}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


SHORT = {"Landmark Position": "LP", "Counterfactual": "CF", "Progress Evaluation": "PE", "Action Generation": "AG",
         "object_rel_distance": "RDist", "object_rel_direction": "RDir", "route_planning": "RP",
         "obj_appearance_order": "AO"}


def report(rows: list[dict]) -> str:
    """The table of a list of results: accuracy at each quarter of each phase beside chance,
    the letter floor and the ceiling, then the test accuracy per task at the end."""
    lines = ["| variant | seed | chance / floor / ceiling | warm start: accuracy at 1/4, 1/2, 3/4, all "
             "(examples seen) | GRPO: accuracy at 1/4, 1/2, 3/4, all (completions sampled) | GRPO: groups all "
             "scored alike, entropy (first -> last quarter) | seconds (SFT + GRPO) |", "|" + "---|" * 7]
    for r in rows:
        sft = " / ".join(_pct(p["accuracy"]) for p in r["sft"]) + f" ({r['sft'][-1]['examples']})"
        grpo = (" / ".join(_pct(p["accuracy"]) for p in r["grpo"]) + f" ({r['grpo'][-1]['completions']})"
                if r["grpo"] else "-")
        last = r["grpo"][-1] if r["grpo"] else {}
        spread = (f"{_pct(last['frac_reward_zero_std'][0])} -> {_pct(last['frac_reward_zero_std'][1])} %, "
                  f"{last['entropy'][0]:.2f} -> {last['entropy'][1]:.2f}" if "entropy" in last else "-")
        lines.append(f"| {r['variant']} | {r['seed']} | {_pct(r['chance'])} / {_pct(r['floor'])} / "
                     f"{_pct(r['ceiling'])} | {sft} | {grpo} | {spread} | "
                     f"{r['seconds']['sft']:.0f} + {r['seconds']['grpo']:.0f} |")
    lines += ["", "Test accuracy per task at the end, % (LP Landmark Position, CF Counterfactual, PE Progress "
              "Evaluation, AG Action Generation, RDist/RDir relative distance/direction, RP route planning, "
              "AO appearance order):", ""]
    tasks = [t for t in SHORT if any(t in (r["grpo"] or r["sft"])[-1]["by_task"] for r in rows)]
    lines += ["| variant | seed | " + " | ".join(SHORT[t] for t in tasks) + " |", "|" + "---|" * (len(tasks) + 2)]
    for r in rows:
        end = (r["grpo"] or r["sft"])[-1]["by_task"]
        lines.append(f"| {r['variant']} | {r['seed']} | " + " | ".join(_pct(end[t]) if t in end else "-" for t in tasks)
                     + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[42])
    parser.add_argument("--home", type=Path, default=None, help="where the benchmark and models are made "
                        "(default: a new temporary folder)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own); "
                        "on a busy machine one thread is several times faster than two")
    parser.add_argument("--list", action="store_true", help="list the variants and exit")
    parser.add_argument("--report", type=Path, default=None, help="print the table of a --json file and exit")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(args.report.read_text())))
        return 0
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.list:
        base = {k: getattr(READ, k) for k in READ.__dataclass_fields__}
        for name, v in VARIANTS.items():
            changed = {k: getattr(v, k) for k in base if getattr(v, k) != base[k] and k != "note"}
            print(f"{name:20s} {changed or 'the reading design'}{'  # ' + v.note if v.note else ''}")
        return 0
    unknown = [n for n in args.variants if n not in VARIANTS]
    if unknown:
        print(f"unknown variants {unknown}; --list shows them", file=sys.stderr)
        return 2
    home = (args.home or Path(tempfile.mkdtemp(prefix="learnability-"))).resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["EMBODIED_R_HOME"] = str(home)
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
    rows = []
    for name in args.variants:
        for seed in args.seeds:
            rows.append(run_variant(name, VARIANTS[name], seed, home))
            print(json.dumps({k: rows[-1][k] for k in ("variant", "seed", "seconds")}
                             | {"accuracy": [p["accuracy"] for p in rows[-1]["sft"] + rows[-1]["grpo"]]}), flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
