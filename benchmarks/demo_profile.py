"""Where the demo's time goes: a GRPO step, a warm-start step and the synthetic download, split
into their parts, so that the next slowdown is found with one command.

    python benchmarks/demo_profile.py                      # all three, 40 steps each
    python benchmarks/demo_profile.py --parts grpo --steps 60
    python benchmarks/demo_profile.py --home ~/.embodied-r --json profile.json

Each part runs the pipeline's own code in this process, with timers around the methods it
calls (no sampling profiler, no change to the code measured):

- ``grpo``: the GRPO trainer child's ``main`` (``training.grpo``) for ``--steps`` steps of
  stage 1 (format and accuracy rewards) and of stage 3 (the consistency reward too, which asks
  the frozen reference model), from the home's warm-started model, logging into a scratch
  MLflow store as the demo does. A step splits into generation (prompt tokenising, sampling,
  decoding), reward scoring, the reference's log-probabilities (KL), the policy's
  log-probabilities and loss, backward, the optimizer, checkpoint saves, logging and
  callbacks, and the rest of the trainer's loop.
- ``warmstart``: the SFT child (``training.sft_child``) for ``--steps`` steps from the untrained
  reasoner: data preparation, forward, backward, optimizer, logging, the rest.
- ``download``: the synthetic benchmark written into a scratch folder, under ``cProfile``,
  grouped into drawing the worlds, rendering frames, encoding video, reading it back,
  zip and Parquet writing, and the Python that plans flights and writes questions; time spent
  waiting for worker processes is its own row (their own CPU time is in the part's CPU line).

A time is exclusive: a timed call's seconds less those of the timed calls inside it, so the
rows of a part add up to its wall time. Beside each trainer phase's wall time is its CPU time
(every thread of the process), which a busy machine inflates less. The stages the parts read (download to warm start)
are made in ``--home`` with the library first when missing (the demo's home by default, so a
home where ``embodied-r demo`` ran is reused as it is); what the parts write goes to a scratch
folder that is removed at the end. Figures are this machine's at this moment: compare two
runs of the code (before, after) on the same machine in turns, not against a number written
down.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("OPENCV_LOG_LEVEL", "ERROR")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

PARTS = ("grpo", "warmstart", "download")
SETUP = "setup: "  # a phase before the first step: reported in seconds, not per step


def cpu_seconds() -> float:
    """User and system seconds of this process and of its finished children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Phases:
    """Exclusive wall and CPU seconds per phase of the calls patched in with ``timed``. CPU is
    the process's, every thread's (torch's pool included): on a machine shared with other work
    it says what a phase costs better than the wall time, which waits for the cores too."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self._inner: list[list[float]] = []  # per open timed call: wall and CPU of the timed calls inside it

    def wrap(self, func: Callable[..., Any], phase: str | Callable[[], str]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            name = phase() if callable(phase) else phase
            self._inner.append([0.0, 0.0])
            started, cpu = time.perf_counter(), time.process_time()
            try:
                return func(*args, **kwargs)
            finally:
                elapsed, used = time.perf_counter() - started, time.process_time() - cpu
                inner_wall, inner_cpu = self._inner.pop()
                self.seconds[name] += elapsed - inner_wall
                self.cpu[name] += used - inner_cpu
                if self._inner:
                    self._inner[-1][0] += elapsed
                    self._inner[-1][1] += used

        return timed_call

    @contextlib.contextmanager
    def timed(self, patches: list[tuple[Any, str, str | Callable[[], str]]]) -> Iterator["Phases"]:
        """``(owner, attribute, phase)``: each attribute replaced by its timed call while the
        block runs; one the installed version lacks is left out."""
        saved = []
        for owner, attr, phase in patches:
            if attr in vars(owner):
                saved.append((owner, attr, vars(owner)[attr]))
                setattr(owner, attr, self.wrap(getattr(owner, attr), phase))
        try:
            yield self
        finally:
            for owner, attr, original in reversed(saved):
                setattr(owner, attr, original)


def grad_phase(with_grad: str, without: str) -> Callable[[], str]:
    def phase() -> str:
        import torch

        return with_grad if torch.is_grad_enabled() else without

    return phase


def trainer_patches(extra: list[tuple[Any, str, Any]]) -> list[tuple[Any, str, Any]]:
    """What every trainer step shares: backward, the optimizer, saving, logging, callbacks."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer
    from transformers import Trainer
    from transformers.trainer_callback import CallbackHandler

    return [
        *extra,
        (Accelerator, "backward", "backward"),
        (Accelerator, "clip_grad_norm_", "optimizer (clip, AdamW)"),
        (AcceleratedOptimizer, "step", "optimizer (clip, AdamW)"),
        (Trainer, "_save_checkpoint", "checkpoint saves"),
        (Trainer, "log", "logging and callbacks"),
        (CallbackHandler, "call_event", "logging and callbacks"),
        (Trainer, "train", "trainer loop, data loading, rest"),
    ]


def grpo_patches() -> list[tuple[Any, str, Any]]:
    from trl import GRPOTrainer

    return trainer_patches([
        (GRPOTrainer, "_tokenize_prompts", "generation: prompt tokenising"),
        (GRPOTrainer, "_generate_single_turn", "generation: sampling"),
        (GRPOTrainer, "_generate", "generation: decoding, lengths"),
        (GRPOTrainer, "_calculate_rewards", "reward scoring"),
        (GRPOTrainer, "_get_per_token_logps_and_entropies",
         grad_phase("policy log-probs (forward)", "reference log-probs (KL)")),
        (GRPOTrainer, "_generate_and_score_completions", "advantages, batching"),
        (GRPOTrainer, "_compute_loss", "loss arithmetic"),
        (GRPOTrainer, "log", "logging and callbacks"),
    ])


def sft_patches() -> list[tuple[Any, str, Any]]:
    from trl import SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    import embodied_r.training.sft as sft

    return trainer_patches([
        (sft, "record_examples", SETUP + "data preparation (templating, cutting, length check)"),
        (DataCollatorForLanguageModeling, "torch_call", "batch collation"),
        (SFTTrainer, "compute_loss", "forward, loss, token metrics"),
        (SFTTrainer, "log", "logging and callbacks"),
    ])


def scratch_run(store: Path, name: str) -> tuple[str, str]:
    """A run in a scratch SQLite MLflow store, for the trainer to log its steps into as the
    demo's trainers do."""
    from embodied_r.tracking.runs import Tracker

    uri = f"sqlite:///{store / 'mlflow.db'}"
    tracker = Tracker.open("profile", uri, store)
    run = tracker.client.create_run(tracker.experiment_id, run_name=name)
    return run.info.run_id, uri


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def trained_steps(work: Path) -> int:
    result = json.loads((work / "train_result.json").read_text())
    return int(result.get("steps_this_run") or result.get("steps") or 0)


def run_child_main(main: Callable[[str], int], spec: dict[str, Any], work: Path, patches: list,
                   store: Path, name: str) -> dict[str, Any]:
    """The child's ``main`` on ``spec`` in this process, timed: its phases per step."""
    from embodied_r.io import write_json_atomic

    work.mkdir(parents=True)
    spec_path = work / "spec.json"
    write_json_atomic(spec_path, spec)
    run_id, uri = scratch_run(store, name)
    cpu, started = cpu_seconds(), time.perf_counter()
    with environ({"MLFLOW_RUN_ID": run_id, "MLFLOW_TRACKING_URI": uri}), Phases().timed(patches) as phases:
        main(str(spec_path))
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    in_steps = {k: v for k, v in phases.seconds.items() if not k.startswith(SETUP)}
    setup = {k[len(SETUP):]: v for k, v in phases.seconds.items() if k.startswith(SETUP)}
    # Loading the model, building the trainer, saving the model and the result.
    setup["the rest"] = wall - sum(phases.seconds.values())
    return {"steps": trained_steps(work), "wall": wall, "cpu": cpu, "phases": in_steps, "setup_and_save": setup,
            "phases_cpu": {k: v for k, v in phases.cpu.items() if not k.startswith(SETUP)}}


def grpo_part(home_stages: dict[str, Any], scratch: Path, steps: int, store: Path) -> dict[str, Any]:
    from embodied_r.training import grpo
    from embodied_r.training.config import GRPOStageConfig, TrainingConfig
    from embodied_r.training.stage import local_model, stage_spec

    out = {}
    warm = str(Path(home_stages["warmstart"].out) / "model")
    records = Path(home_stages["convert"].out)
    for name in ("train_stage1", "train_stage3"):
        config = home_stages[name].config
        training = TrainingConfig.model_validate({**config["training"], "stages": [config["stage"]],
                                                  "max_steps_per_stage": steps})
        stage = GRPOStageConfig.model_validate(config["stage"])
        work = scratch / name
        spec = stage_spec(records, local_model(warm), work, stage, training)
        # A stage's own seed and place in the schedule, as the demo's stage has them.
        spec["stage_index"] = int(name[-1])
        out[name] = run_child_main(grpo.main, spec, work, grpo_patches(), store, name)
    return out


def warmstart_part(home_stages: dict[str, Any], scratch: Path, steps: int, store: Path) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embodied_r.io import write_parquet_atomic
    from embodied_r.training import sft_child
    from embodied_r.training.config import SFTConfig
    from embodied_r.training.stage import local_model
    from embodied_r.training.warmstart import traces
    from embodied_r.training.config import WarmstartConfig

    sp = home_stages["warmstart"]
    cfg = WarmstartConfig.model_validate({**sp.config, "max_steps": steps})
    records = Path(home_stages["convert"].out)
    work = scratch / "warmstart"
    trace_dir = scratch / "warmstart-traces"
    trace_dir.mkdir(parents=True)
    rows = pq.read_table(records / "train.parquet").to_pylist()
    write_parquet_atomic(pa.Table.from_pylist(traces(rows, cfg)), trace_dir / "train.parquet")
    spec = {"examples": "embodied_r.training.sft:record_examples", "records": str(trace_dir),
            "init_model": local_model(sp.inputs["init_model"]),
            "sft": cfg.model_dump(mode="json", include=set(SFTConfig.model_fields)),
            "work": str(work), "stage": "warmstart"}
    return {"warmstart": run_child_main(sft_child.main, spec, work, sft_patches(), store, "warmstart")}


# cProfile rows of the download, grouped: (category, words of a function's name or file).
DOWNLOAD_GROUPS = (
    ("video encoding", ("cv2.VideoWriter",)),
    ("frame rendering (warp)", ("warpAffine", "camera_view")),
    ("video read-back check", ("_check_written", "VideoCapture")),
    ("world drawing", ("panorama", "draw_thing")),
    ("waiting for worker processes", ("acquire", "wait", "poll", "recv", "select")),
    ("zip and Parquet writing", ("zipfile", "pyarrow", "parquet", "_zip_add", "write_parquet")),
)
DOWNLOAD_REST = "flights, rooms, questions, truth (Python)"


def _label(func: tuple[str, int, str]) -> str:
    filename, _, name = func
    return f"{filename}:{name}"


def _group(label: str) -> str | None:
    for category, words in DOWNLOAD_GROUPS:
        if any(w in label for w in words):
            return category
    return None


def download_part(home_stages: dict[str, Any], scratch: Path) -> dict[str, Any]:
    from embodied_r.code_keys import runner
    from embodied_r.stage_kinds import kind_of

    sp = home_stages["download"]
    out = scratch / "download"
    profile = cProfile.Profile()
    cpu, started = cpu_seconds(), time.perf_counter()
    profile.enable()
    runner(kind_of(sp.kind).runner)(out, sp.config, {**sp.inputs, "sources_root": str(scratch / "sources")}, None)
    profile.disable()
    wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    stats = pstats.Stats(profile)
    phases: dict[str, float] = defaultdict(float)
    for func, (_, _, tottime, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        category = _group(_label(func))
        if category is None and func[0] == "~":
            # A C function: counted where its biggest caller is.
            top = max(callers.items(), key=lambda kv: kv[1][2], default=None)
            category = _group(_label(top[0])) if top else None
        phases[category or DOWNLOAD_REST] += tottime
    # cProfile's own cost lands in the Python rows: the measured total is the wall time.
    profiled = sum(phases.values())
    phases = {k: v * wall / profiled for k, v in phases.items()} if profiled else dict(phases)
    return {"download": {"steps": 0, "wall": wall, "cpu": cpu, "phases": phases, "setup_and_save": {}}}


def prepare(home: Path, recipe: str, seed: int | None) -> Any:
    """The plan of the demo at ``home``, its stages up to the warm start made when missing."""
    from embodied_r.config import load_recipe
    from embodied_r.experiments.spec import seed_overrides
    from embodied_r.pipeline import execute, plan

    overrides = seed_overrides(seed) if seed is not None else None
    stages = plan(load_recipe(recipe, overrides), home)
    for name in ("download", "preprocess", "keyframes", "perception", "convert", "warmstart"):
        if not stages[name].complete:
            print(f"making {name} in {home} ...", file=sys.stderr, flush=True)
        execute(stages[name])
    return stages


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = []
    for part, r in results.items():
        steps = r["steps"]
        unit = f"ms/step over {steps} steps" if steps else "s"
        setup = r["setup_and_save"]
        lines.append(f"\n{part}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU"
                     + (f", {1000 * sum(r['phases'].values()) / steps:.0f} ms a step" if steps else "")
                     + (f"; before and after the steps {sum(setup.values()):.1f} s ("
                        + ", ".join(f"{k} {v:.1f} s" for k, v in setup.items()) + ")" if setup else ""))
        total = sum(r["phases"].values()) or 1.0
        cpu = r.get("phases_cpu") or {}
        lines.append(f"  {'phase':<52} {unit:>26} {'share':>6}" + (f" {'CPU':>9}" if cpu else ""))
        for name, seconds in sorted(r["phases"].items(), key=lambda kv: -kv[1]):
            scale = 1000 / steps if steps else 1.0
            lines.append(f"  {name:<52} {seconds * scale:>26.1f} {100 * seconds / total:>5.1f}%"
                         + (f" {cpu.get(name, 0.0) * scale:>9.1f}" if cpu else ""))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, default=None,
                        help="project home whose stages the parts read (default: the demo's home)")
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--seed", type=int, default=None, help="the trainers' seed (default: the recipe's)")
    parser.add_argument("--steps", type=int, default=40, help="trainer steps per GRPO stage and warm start")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")

    from embodied_r.paths import home as default_home

    home = (args.home or default_home()).expanduser().resolve()
    stages = prepare(home, args.recipe, args.seed)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="demo-profile-") as tmp:
        scratch = Path(tmp)
        store = scratch / "mlflow"
        store.mkdir()
        for part in parts:
            print(f"profiling {part} ...", file=sys.stderr, flush=True)
            if part == "grpo":
                results.update(grpo_part(stages, scratch, args.steps, store))
            elif part == "warmstart":
                results.update(warmstart_part(stages, scratch, args.steps, store))
            else:
                results.update(download_part(stages, scratch))
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
