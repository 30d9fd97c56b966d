"""The tiny models' checks of ``embodied-r check gpu`` (``gpu_check`` runs each in a process
of its own): the transformers backend, one GRPO step per reward schedule, one SFT step, and
one step under ``accelerate launch``. Each takes the check's spec (its device: ``cuda``, or
``cpu`` to check the checks themselves; its work folder) and returns ``{"ok", "detail",
"figures"}``; ``Skip`` says why one cannot run here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from embodied_r.backends.base import BackendConfig
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.training.config import GRPOStageConfig, TrainingConfig, paper_stages

VIDEO_LINE = ("Frame {i}: After move forward, Observe: a street with buildings on both sides, a red building on "
              "the right, a tree on the left and a bridge far ahead.")


class Skip(Exception):
    """A check that cannot run here; the message says why."""


def write_records(folder: Path, n: int, frames: int = 2) -> Path:
    """``train.parquet`` of ``n`` records built as the convert stage builds them, each with
    ``frames`` lines of perception text (the prompt's length)."""
    from embodied_r import schemas
    from embodied_r.training.records import RecordsConfig, build_record

    video = "\n".join(VIDEO_LINE.format(i=i) for i in range(frames))
    rows = [{"uid": f"check:{i}", "benchmark": "urbanvideo", "category": "landmark_position", "split": "train",
             "question": "Which direction is the bridge?", "options": ["A. left", "B. right", "C. ahead", "D. behind"],
             "answer": "ABCD"[i % 4], "answer_type": "choice"} for i in range(n)]
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet_atomic(table_from_records([build_record(r, video, RecordsConfig()) for r in rows], schemas.RECORDS),
                         folder / "train.parquet")
    return folder


def tiny_training(spec: dict[str, Any], **updates: Any) -> TrainingConfig:
    """The tiny models' GRPO settings on the check's device: one step, a tiny reference."""
    cpu = spec["device"] == "cpu"
    data: dict[str, Any] = dict(
        policy="tiny:lm", reference=BackendConfig(model="tiny:lm", device="cpu" if cpu else "auto", max_new_tokens=4),
        num_generations=2, per_device_train_batch_size=4, gradient_accumulation_steps=1, max_completion_length=16,
        max_steps_per_stage=1, use_cpu=cpu, gradient_checkpointing=False, learning_rate=1e-4, save_steps=100,
        completion_table_rows=0, stages=paper_stages())
    data.update(updates)
    return TrainingConfig.model_validate(data)


def _stage(name: str) -> GRPOStageConfig:
    return next(s for s in paper_stages() if s.name == name)


def one_step_problems(summary: dict[str, Any], processes: int = 1) -> list[str]:
    """What is wrong with a trainer run that should have made one step in ``processes``
    processes and saved its model (empty when nothing is)."""
    problems = []
    if summary.get("steps") != 1:
        problems.append(f"{summary.get('steps')} steps, expected 1")
    if summary.get("processes") != processes:
        problems.append(f"trained in {summary.get('processes')} processes, expected {processes}")
    if not (Path(summary["model"]) / "config.json").is_file():
        problems.append(f"no model saved in {summary['model']}")
    return problems


def check_backend(spec: dict[str, Any]) -> dict[str, Any]:
    """The transformers backend with device ``auto`` (``cpu`` when forced): the tiny LM, and
    the tiny VLM with an image, on the GPU in its inference dtype, generating."""
    from PIL import Image

    from embodied_r.backends.devices import inference_dtype
    from embodied_r.backends.hf_local import TransformersBackend

    on_gpu = spec["device"] != "cpu"
    want_device, want_dtype = ("cuda", inference_dtype(True)) if on_gpu else ("cpu", "float32")
    image = Path(spec["work"]) / "image.png"
    Image.new("RGB", (64, 48), (120, 30, 200)).save(image)
    seen, problems = [], []
    for model, content in (("tiny:lm", "hello"),
                           ("tiny:vlm", [{"type": "image", "path": str(image)}, {"type": "text", "text": "hi"}])):
        backend = TransformersBackend(BackendConfig(model=model, device="auto" if on_gpu else "cpu", max_new_tokens=6))
        try:
            dtype = str(backend.model.dtype).replace("torch.", "")
            device = str(backend.model.device)
            out = backend.generate([[{"role": "user", "content": content}]] * 2)
        finally:
            backend.close()
        seen.append(f"{model} on {device} in {dtype}")
        if not device.startswith(want_device) or dtype != want_dtype:
            problems.append(f"{model} on {device} in {dtype}, expected {want_device} in {want_dtype}")
        problems += [f"{model}: {g.error}" for g in out if g.error or g.completion_tokens < 1]
    return {"ok": not problems, "detail": "; ".join(problems or seen), "figures": {"dtype": want_dtype}}


def check_grpo(spec: dict[str, Any], stage_name: str) -> dict[str, Any]:
    """One GRPO step of a reward schedule with the tiny models; stage 3 also asks its
    consistency reference once, on the check's device."""
    from embodied_r.training.stage import run_training_stage

    work = Path(spec["work"])
    cfg = tiny_training(spec)
    summary = run_training_stage(write_records(work / "records", 8), cfg.policy, work / stage_name,
                                 _stage(stage_name), cfg)
    problems = one_step_problems(summary)
    detail = f"weights {summary.get('reward_weights')}, {summary.get('seconds_per_step')} s/step"
    if stage_name == "stage3":
        if "consistency_reward" not in summary.get("reward_funcs", []):
            problems.append(f"no consistency reward in {summary.get('reward_funcs')}")
        asked = ask_reference(cfg.reference)
        detail += f"; reference on {asked['device']}, asked {asked['asked']:.0f} time(s)"
        problems += asked["problems"]
    return {"ok": not problems, "detail": "; ".join(problems) or detail,
            "figures": {k: summary.get(k) for k in ("seconds_per_step", "peak_gpu_memory_gib")}}


def ask_reference(reference: BackendConfig) -> dict[str, Any]:
    """The consistency reward over ``reference``: one completion in the answer format is
    asked, the others are scored without it."""
    from embodied_r.scoring.rewards import make_consistency_reward

    reward = make_consistency_reward(reference, require_correct=True)
    metrics: dict[str, float] = {}
    try:
        scores = reward(["<think>I moved forward; the bridge stays ahead.</think><answer>C</answer>", "no format"],
                        solution=["C", "C"], question=["Which direction is the bridge?"] * 2,
                        answer_type=["choice"] * 2, options=[["A. left", "B. right", "C. ahead", "D. behind"]] * 2,
                        log_metric=metrics.__setitem__)
        device = str(getattr(reward.backend, "device", "?"))
    finally:
        reward.close()
    problems = []
    if metrics.get("consistency/asked") != 1.0:
        problems.append(f"the reference was asked {metrics.get('consistency/asked')} times, expected 1")
    if scores[0] is None or scores[1] != 0.0:
        problems.append(f"scores {scores}: the asked completion must be scored, the other 0")
    if reference.device == "auto" and not device.startswith("cuda"):
        problems.append(f"the reference runs on {device}, not the GPU")
    return {"device": device, "asked": metrics.get("consistency/asked", 0.0), "problems": problems}


def check_sft(spec: dict[str, Any]) -> dict[str, Any]:
    from embodied_r.training.config import SFTConfig
    from embodied_r.training.sft import run_sft

    work = Path(spec["work"])
    cfg = SFTConfig(use_cpu=spec["device"] == "cpu", max_steps=1, save_steps=100, gradient_checkpointing=False,
                    per_device_train_batch_size=2, gradient_accumulation_steps=1, max_length=512)
    summary = run_sft(write_records(work / "records", 4), "tiny:lm", work / "sft", cfg)
    problems = one_step_problems(summary)
    return {"ok": not problems, "detail": "; ".join(problems) or f"loss {summary.get('final_loss')}",
            "figures": {"seconds_per_step": summary.get("seconds_per_step")}}


def check_accelerate(spec: dict[str, Any]) -> dict[str, Any]:
    """A GRPO step under ``accelerate launch`` with one process (a config written here, so
    the machine's own default accelerate config does not decide)."""
    import yaml

    from embodied_r.training.stage import run_training_stage

    work = Path(spec["work"])
    cpu = spec["device"] == "cpu"
    config = work / "accelerate-1proc.yaml"
    config.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO",
                                      "num_processes": 1, "num_machines": 1, "machine_rank": 0,
                                      "mixed_precision": "no", "use_cpu": cpu, "gpu_ids": "all"}))
    cfg = tiny_training(spec, launcher="accelerate", accelerate_config=str(config))
    summary = run_training_stage(write_records(work / "records", 8), cfg.policy, work / "accelerate",
                                 _stage("stage1"), cfg)
    problems = one_step_problems(summary)
    log = (work / "accelerate" / "train.log").read_text() if (work / "accelerate" / "train.log").is_file() else ""
    if "accelerate.commands.launch" not in log:
        problems.append("train.log records no accelerate launch")
    return {"ok": not problems, "detail": "; ".join(problems) or f"{summary.get('seconds_per_step')} s/step",
            "figures": {"seconds_per_step": summary.get("seconds_per_step")}}


CHECKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "backend": check_backend,
    "grpo-stage1": lambda spec: check_grpo(spec, "stage1"),
    "grpo-stage2": lambda spec: check_grpo(spec, "stage2"),
    "grpo-stage3": lambda spec: check_grpo(spec, "stage3"),
    "sft": check_sft,
    "accelerate": check_accelerate,
}
