"""Where and how a trainer child runs: the training interpreter, ``accelerate launch`` and its
configs, and the parent side that streams the child's output and progress."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from embodied_r import progress
from embodied_r.children import children_deaf_to_ctrl_c
from embodied_r.io import read_json, write_json_atomic
from embodied_r.settings import operational
from embodied_r.training.multinode import main_node_args

SPEC_NAME = "spec.json"
RESULT_NAME = "train_result.json"
LOG_NAME = "train.log"
LAUNCH_MARK = "$ "  # a train.log line recording the command run
CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
# The source checkout: relative config paths (infra/...) are also looked up here.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
TRAIN_PYTHON_ENV = "EMBODIED_R_TRAIN_PYTHON"


def launch_line(cmd: list[str]) -> str:
    """How a stage's log records the command it runs: quoted as a shell reads it, so that a
    checkout or home path with spaces comes back whole (``launch_command``); the other node's
    follower replays it from there."""
    return f"{LAUNCH_MARK}{shlex.join(cmd)}\n"


def launch_command(line: str) -> list[str] | None:
    """The command a ``launch_line`` records, or None for any other line of the log."""
    if not line.startswith(LAUNCH_MARK):
        return None
    try:
        return shlex.split(line[len(LAUNCH_MARK):])
    except ValueError:  # a trainer's own output that happens to start the same way
        return None


def resolve_config_file(path: str | Path) -> Path:
    """An absolute path, else relative to the working folder, else to the source checkout."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        found = [candidate]
    else:
        found = [Path.cwd() / candidate, PROJECT_ROOT / candidate]
    for option in found:
        if option.is_file():
            return option.resolve()
    raise ValueError(f"config file {path} not found (looked at {', '.join(str(p) for p in found)})")


def read_accelerate_config(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"accelerate config {path} is not a mapping")
    return data


def deepspeed_file(accelerate_config: Path) -> Path | None:
    """The DeepSpeed JSON an accelerate config names, resolved beside that config."""
    name = (read_accelerate_config(accelerate_config).get("deepspeed_config") or {}).get("deepspeed_config_file")
    if not name:
        return None
    path = Path(name).expanduser()
    path = path if path.is_absolute() else Path(accelerate_config).parent / path
    if not path.is_file():
        raise ValueError(f"{accelerate_config} names DeepSpeed config {name}, which is not at {path}")
    return path.resolve()


def zero_stage(accelerate_config: Path) -> int | None:
    """The ZeRO stage an accelerate config asks for, or None without DeepSpeed."""
    data = read_accelerate_config(accelerate_config)
    if data.get("distributed_type") != "DEEPSPEED":
        return None
    json_path = deepspeed_file(accelerate_config)
    if json_path is not None:
        return int(json.loads(json_path.read_text()).get("zero_optimization", {}).get("stage", 0))
    return int((data.get("deepspeed_config") or {}).get("zero_stage", 0))


def num_processes(accelerate_config: Path) -> int:
    return int(read_accelerate_config(accelerate_config).get("num_processes", 1))


class LoraSettings(BaseModel):
    """Low-rank adapters (peft) instead of full fine-tuning, for one smaller GPU."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(64, ge=1)
    alpha: int = Field(128, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    # "all-linear" adapts every linear layer but the output head; a string other than
    # that is a regular expression over module names.
    target_modules: str | list[str] = "all-linear"
    # peft's init_lora_weights: True starts from the identity (B = 0); False is random,
    # or a named scheme ("gaussian", "pissa", "olora", ...).
    init_lora_weights: bool | str = True


class TrainerEnvironment(BaseModel):
    """How and where a trainer process runs; shared by the GRPO stages and SFT."""

    model_config = ConfigDict(extra="forbid")

    use_cpu: bool = False
    bf16: bool | None = None  # None: when a GPU is used, not on the CPU
    gradient_checkpointing: bool = operational(True)  # memory for time; the same gradients
    seed: int = 42
    logging_steps: int = operational(1, ge=1)
    save_steps: int = operational(100, ge=1)
    save_total_limit: int | None = operational(2)
    # Checkpoints without the optimizer state: a fraction of the disk, but a resumed stage
    # restarts its optimizer (Adam's moments) from zero.
    save_only_model: bool = operational(False)
    keep_checkpoints: bool = operational(False)  # checkpoints only serve a resume; the model is saved apart
    lora: LoraSettings | None = None
    launcher: Literal["python", "accelerate"] = "python"
    # Relative paths are looked up in the working folder, then in the source checkout.
    accelerate_config: str | None = None
    # The interpreter of the training environment; None: $EMBODIED_R_TRAIN_PYTHON, else this one.
    python: str | None = operational(None)

    @model_validator(mode="after")
    def _check_launch(self) -> "TrainerEnvironment":
        if self.accelerate_config is None:
            return self
        if self.launcher != "accelerate":
            raise ValueError("accelerate_config is only read with launcher: accelerate; set both or neither")
        config = resolve_config_file(self.accelerate_config)
        if self.lora is not None and zero_stage(config) == 3:
            raise ValueError(
                f"LoRA cannot be merged into ZeRO-3 sharded weights ({self.accelerate_config}); "
                "use ZeRO-2, one GPU, or full fine-tuning"
            )
        return self

    def deepspeed(self) -> bool:
        return bool(self.accelerate_config) and zero_stage(resolve_config_file(self.accelerate_config)) is not None

    def accelerate_processes(self) -> int | None:
        """The process count the accelerate config names, or None without one (a launcher
        of python, or accelerate's own defaults)."""
        if self.launcher == "accelerate" and self.accelerate_config:
            return num_processes(resolve_config_file(self.accelerate_config))
        return None

    def bf16_weights(self, bf16: bool) -> bool:
        """Whether the policy's weights load in bfloat16 when training runs in bf16: only where an fp32
        copy is kept (DeepSpeed's bf16 optimizer, LoRA's fp32 adapters). A plain AdamW steps the
        weights it is given, and a bf16 weight rounds away updates below ~1/256 of it (every update
        at lr 5e-7), so there the weights stay fp32 under autocast."""
        return bf16 and (self.lora is not None or self.deepspeed())

    def interpreter(self) -> str:
        python = self.python or os.environ.get(TRAIN_PYTHON_ENV) or sys.executable
        found = shutil.which(str(Path(python).expanduser()))
        if found is None:
            raise FileNotFoundError(
                f"training interpreter {python} does not exist; create the training environment "
                "(infra/training/requirements.txt) or unset training.python"
            )
        return found

    def command(self, module: str, spec_path: Path) -> list[str]:
        """``python -m MODULE SPEC``, under ``accelerate launch`` when asked."""
        python = self.interpreter()
        if self.launcher != "accelerate":
            return [python, "-m", module, str(spec_path)]
        cmd = [python, "-m", "accelerate.commands.launch"]
        if self.accelerate_config:
            config = resolve_config_file(self.accelerate_config)
            cmd += ["--config_file", str(config)]
            cmd += main_node_args(read_accelerate_config(config), str(config))
            ds = deepspeed_file(config)
            if ds is not None:
                # accelerate reads a relative path against the working folder; pin it.
                cmd += ["--deepspeed_config_file", str(ds)]
        return cmd + ["-m", module, str(spec_path)]


def _child_env(mlflow_run_id: str | None, uri: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # The child must import this very package, installed or not (and in a training
    # environment that does not install it).
    root = str(PROJECT_ROOT)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.pop("MLFLOW_RUN_ID", None)
    from embodied_r.children import PARENT_PID_ENV

    env[PARENT_PID_ENV] = str(os.getpid())
    env.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if mlflow_run_id:
        from embodied_r.tracking.store import tracking_uri

        env["MLFLOW_RUN_ID"] = mlflow_run_id
        env["MLFLOW_TRACKING_URI"] = uri or tracking_uri()
    return env


# A trainer child prints ``PROGRESS_MARK step total`` after each optimizer step; the parent
# turns it into progress updates (a CLI bar, a Prefect progress artifact).
PROGRESS_MARK = "[embodied-r progress]"


def progress_callback() -> Any:
    """A TrainerCallback that prints a progress line after each step (main process only) and
    marks each saved checkpoint as an item boundary (``io.item_done``)."""
    from transformers import TrainerCallback

    class PrintProgress(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.is_world_process_zero and state.max_steps:
                print(f"{PROGRESS_MARK} {state.global_step} {state.max_steps}", flush=True)

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            from embodied_r.io import item_done

            item_done("train")  # a checkpoint is whole once the trainer calls this

    return PrintProgress()


def _progress_line(line: str, what: str) -> bool:
    if not line.startswith(PROGRESS_MARK):
        return False
    try:
        step, total = (int(x) for x in line[len(PROGRESS_MARK):].split()[:2])
    except ValueError:
        return False
    progress.update(what, step, total)
    return True


# A library's INFO or DEBUG record in the child's log format (alembic's plugins as MLflow opens
# its SQLite store, once per trainer): the trainer's log keeps it, the console does not.
LIBRARY_INFO = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|DEBUG) (?!embodied_r[.:])\S+: ")


def _step_line(line: str, pace: progress.Pace) -> str | None:
    """The compact terminal line of a trainer's step report, with the stage's time left, or None
    for another line."""
    from embodied_r.training.callbacks import STEP_MARK

    if not line.startswith(STEP_MARK):
        return None
    try:
        record = json.loads(line[len(STEP_MARK):])
        return progress.step_line(record) + pace.note(record.get("step"), record.get("total"))
    except (ValueError, TypeError, AttributeError):
        return None


def _stream(cmd: list[str], env: dict[str, str], log_path: Path, what: str = "train") -> int:
    """Run ``cmd``, copying its output line by line to ``log_path`` and to our stdout, where a
    step report becomes one compact line (the full report stays in the log)."""
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(launch_line(cmd))
        with children_deaf_to_ctrl_c():
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace", bufsize=1)
        pace = progress.Pace()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if _progress_line(line, what):
                    continue
                compact = _step_line(line, pace)
                if compact is not None:
                    progress.say(compact)
                elif not LIBRARY_INFO.match(line):
                    progress.say(line.rstrip("\n"))
                log_file.write(line)
                log_file.flush()
            return proc.wait()
        except BaseException:
            # Interrupted: do not leave a trainer running without its parent.
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


def run_child(module: str, spec: dict[str, Any], work: Path, env_cfg: TrainerEnvironment,
              mlflow_run_id: str | None, what: str, uri: str | None = None) -> dict[str, Any]:
    """Write ``spec``, run ``python -m module`` on it in ``work`` and return its result.
    With ``mlflow_run_id`` the child logs into that run of ``uri`` (default: the
    environment's or the project's store)."""
    spec_path = work / SPEC_NAME
    write_json_atomic(spec_path, spec)
    result_path = work / RESULT_NAME
    if result_path.exists():
        result_path.unlink()  # a result left by an attempt whose parent died after it
    rc = _stream(env_cfg.command(module, spec_path), _child_env(mlflow_run_id, uri), work / LOG_NAME, what)
    if rc != 0 or not result_path.is_file():
        raise RuntimeError(
            f"{what} failed (exit code {rc}); see {work / LOG_NAME}. "
            f"Its checkpoints stay in {work}, and a re-run resumes from the last one."
        )
    return read_json(result_path)
