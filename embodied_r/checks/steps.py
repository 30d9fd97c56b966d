"""What the checks share: the records they train on, the tiny one-step training config, one GRPO
step, the consistency reward asking its reference, a timed row. Imported in the training
environment too: nothing here needs more than the trainer child, and each function imports its own."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from embodied_r.backends.base import BackendConfig
    from embodied_r.training.config import TrainingConfig

VIDEO_LINE = ("Frame {i}: After move forward, Observe: a street with buildings on both sides, a red building on "
              "the right, a tree on the left and a bridge far ahead.")
# How the checks' rows name the paper's reward schedules (training.config.paper_stages).
SCHEDULES = {"stage1": "format 0.7, accuracy 0.3", "stage2": "format 0.3, accuracy 0.7",
             "stage3": "+ consistency 0.2"}


class Skip(Exception):
    """A check that cannot run here; the message says why."""


def write_records(folder: Path, n: int = 8, frames: int = 2) -> Path:
    """``train.parquet`` of ``n`` records as the convert stage builds them, ``frames`` lines of
    perception text each (the prompt's length)."""
    from embodied_r import schemas
    from embodied_r.io import table_from_records, write_parquet_atomic
    from embodied_r.training.records import build_record
    from embodied_r.training.records_config import RecordsConfig

    video = "\n".join(VIDEO_LINE.format(i=i) for i in range(frames))
    rows = [{"uid": f"check:{i}", "benchmark": "urbanvideo", "category": "landmark_position", "split": "train",
             "question": "Which direction is the bridge?", "options": ["A. left", "B. right", "C. ahead", "D. behind"],
             "answer": "ABCD"[i % 4], "answer_type": "choice"} for i in range(n)]
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(table_from_records([build_record(r, video, RecordsConfig()) for r in rows], schemas.RECORDS),
                         folder / "train.parquet")
    return folder


def tiny_training(device: str, recipe: TrainingConfig | None = None, **updates: Any) -> TrainingConfig:
    """One small step of the tiny models with a tiny consistency reference, at ``recipe``'s
    trainer settings if given, else at a learning rate that moves the tiny weights; ``updates`` last."""
    from embodied_r.backends.base import BackendConfig
    from embodied_r.training.config import TrainingConfig

    cpu = device == "cpu"
    data = recipe.model_dump() if recipe is not None else {"learning_rate": 1e-4, "gradient_checkpointing": False}
    data.update(policy="tiny:lm", use_cpu=cpu, vllm=None, max_steps_per_stage=1, save_steps=100, num_generations=2,
                per_device_train_batch_size=4, gradient_accumulation_steps=1, completions_per_step=None,
                eval_steps=None, keep_best=False, max_completion_length=16, completion_table_rows=0,
                reference=BackendConfig(model="tiny:lm", device="cpu" if cpu else "auto", max_new_tokens=4))
    if cpu:
        data["bf16"] = False  # a recipe's bf16 is a GPU's
    data.update(updates)
    return TrainingConfig.model_validate(data)


def one_step_problems(summary: dict[str, Any], processes: int = 1) -> list[str]:
    """What is wrong with a run that should have made one step and saved its model."""
    problems = []
    if summary.get("steps") != 1:
        problems.append(f"{summary.get('steps')} steps, expected 1")
    if summary.get("processes") != processes:
        problems.append(f"trained in {summary.get('processes')} processes, expected {processes}")
    if not (Path(summary["model"]) / "config.json").is_file():
        problems.append(f"no model saved in {summary['model']}")
    return problems


def grpo_step(records: Path, cfg: TrainingConfig, stage_name: str, out: Path,
              processes: int = 1) -> tuple[dict[str, Any], list[str]]:
    from embodied_r.training.stage import run_training_stage

    stage = next(s for s in cfg.stages if s.name == stage_name)
    summary = run_training_stage(records, cfg.policy, out, stage, cfg)
    return summary, one_step_problems(summary, processes)


def ask_reference(reference: BackendConfig) -> dict[str, Any]:
    """The consistency reward over ``reference`` as the trainer builds it, given a correct
    answer, a wrong one and one out of format: only the first is asked (a random policy seldom
    writes a readable answer, so a training step would never reach the reference)."""
    from embodied_r.scoring.rewards import make_consistency_reward

    reward = make_consistency_reward(reference, require_correct=True)
    metrics: dict[str, float] = {}
    try:
        completions = ["<think>I moved forward; the bridge stays ahead.</think><answer>C</answer>",
                       "<think>The bridge is on my left.</think><answer>A</answer>", "no format at all"]
        scores = reward(completions, solution=["C"] * 3, question=["Which direction is the bridge?"] * 3,
                        answer_type=["choice"] * 3, options=[["A. left", "B. right", "C. ahead", "D. behind"]] * 3,
                        log_metric=metrics.__setitem__)
        device = str(getattr(reward.backend, "device", "?"))
    finally:
        reward.close()
    problems = []
    if metrics.get("consistency/asked") != 1.0:
        problems.append(f"the reference was asked {metrics.get('consistency/asked')} times, expected 1")
    if scores[0] is None or scores[1:] != [0.0, 0.0]:
        problems.append(f"scores {scores}: the asked one must be scored, the others 0")
    if "consistency/skipped" not in metrics:
        problems.append("no consistency/skipped metric logged")
    if reference.device == "auto" and not device.startswith("cuda"):
        problems.append(f"the reference runs on {device}, not the GPU")
    return {"device": device, "asked": metrics.get("consistency/asked", 0.0), "problems": problems}


def timed_row(recipe: str, what: str, world: int, check: Callable[[], list[str]],
              after_failure: Callable[[], list[str]] = list) -> dict[str, Any]:
    """``check``'s problems and seconds; an exception is one, with its traceback and
    ``after_failure``'s findings."""
    started = time.monotonic()
    row: dict[str, Any] = {"recipe": recipe, "what": what, "world": world}
    try:
        problems = check()
    except Exception as exc:  # noqa: BLE001 - every failure is a finding
        problems = [f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=4), *after_failure()]
    row.update(ok=not problems, problems=problems, seconds=round(time.monotonic() - started, 1))
    return row


def finish_check(label: str, tally: str, seconds: float, where: Path, work: Path, keep: bool, passed: int,
                 failed: int) -> int:
    """A CI check's last two lines and exit code; its work folder removed when it passed unless kept."""
    import shutil

    remove = not keep and not failed
    print(f"{label}: took {seconds:.0f} s; details in {where}" + (" (removed)" if remove else ""))
    print(f"{tally}: {passed} passed, {failed} failed")
    if remove:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0
