"""The tiny models' checks of ``embodied-r check gpu``. Each takes the check's spec (its device,
``cuda`` or ``cpu`` to check the checks themselves; its work folder) and returns
``{"ok", "detail", "figures"}``."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Callable

from embodied_r.backends.base import BackendConfig
from embodied_r.checks.steps import SCHEDULES, ask_reference, grpo_step, one_step_problems, tiny_training, write_records


def check_backend(spec: dict[str, Any]) -> dict[str, Any]:
    """The tiny LM, and the tiny VLM with an image, generating on the GPU in its inference dtype."""
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
    """Stage 3 also asks its consistency reference once, on the check's device."""
    work = Path(spec["work"])
    cfg = tiny_training(spec["device"])
    summary, problems = grpo_step(write_records(work / "records"), cfg, stage_name, work / stage_name)
    detail = f"weights {summary.get('reward_weights')}, {summary.get('seconds_per_step')} s/step"
    if stage_name == "stage3":
        if "consistency_reward" not in summary.get("reward_funcs", []):
            problems.append(f"no consistency reward in {summary.get('reward_funcs')}")
        asked = ask_reference(cfg.reference)
        detail += f"; reference on {asked['device']}, asked {asked['asked']:.0f} time(s)"
        problems += asked["problems"]
    return {"ok": not problems, "detail": "; ".join(problems) or detail,
            "figures": {k: summary.get(k) for k in ("seconds_per_step", "peak_gpu_memory_gib")}}


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
    """One process, by a config written here: the machine's default accelerate config must not decide."""
    import yaml

    work = Path(spec["work"])
    cpu = spec["device"] == "cpu"
    config = work / "accelerate-1proc.yaml"
    config.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO",
                                      "num_processes": 1, "num_machines": 1, "machine_rank": 0,
                                      "mixed_precision": "no", "use_cpu": cpu, "gpu_ids": "all"}))
    cfg = tiny_training(spec["device"], launcher="accelerate", accelerate_config=str(config))
    summary, problems = grpo_step(write_records(work / "records"), cfg, "stage1", work / "accelerate")
    log = (work / "accelerate" / "train.log").read_text() if (work / "accelerate" / "train.log").is_file() else ""
    if "accelerate.commands.launch" not in log:
        problems.append("train.log records no accelerate launch")
    return {"ok": not problems, "detail": "; ".join(problems) or f"{summary.get('seconds_per_step')} s/step",
            "figures": {"seconds_per_step": summary.get("seconds_per_step")}}


def check_colocate(spec: dict[str, Any]) -> dict[str, Any]:
    """Rollouts from a colocated vLLM engine (tied embeddings), its weights checked after every
    sync, in float32 so that a stale engine stands out of the kernels' noise (about 1e-5 on a CPU)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not installed in this environment (the training environment has it: "
                           "infra/install-env.sh train)"}
    work = Path(spec["work"])
    cfg = tiny_training(spec["device"], policy="tiny:lm-vllm", use_cpu=False, bf16=False, learning_rate=1e-2,
                        max_prompt_length=1024, max_steps_per_stage=3, vllm={"mode": "colocate", "gpu_memory_utilization": 0.2,
                                                     "max_model_length": 1536, "dtype": "float32",
                                                     "sync_check": True, "sync_tolerance": 1e-3})
    summary = grpo_step(write_records(work / "records"), cfg, "stage1", work / "colocate")[0]
    problems = [] if summary.get("vllm_sync_checks") == summary.get("steps") == 3 else [
        f"{summary.get('vllm_sync_checks')} syncs checked over {summary.get('steps')} steps"]
    gap = summary.get("vllm_sync_max_gap")
    detail = f"3 syncs, largest log-prob gap {gap if gap is None else f'{gap:.1e}'}, {summary.get('seconds_per_step')} s/step"
    return {"ok": not problems, "detail": "; ".join(problems) or detail,
            "figures": {k: summary.get(k) for k in ("vllm_sync_max_gap", "seconds_per_step", "peak_gpu_memory_gib")}}


CHECKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "backend": check_backend, **{f"grpo-{name}": partial(check_grpo, stage_name=name) for name in SCHEDULES},
    "sft": check_sft, "accelerate": check_accelerate, "colocate": check_colocate}
