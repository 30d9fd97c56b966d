"""The paper's baselines on the same questions, each in a keyed evaluation folder: ``policy``, the
untrained reasoner on the same perception text (what GRPO adds), and ``vlm``, the perceiving VLM
answering directly from the same key frames, asked as VSI-Bench asks models."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from embodied_r.backends.base import BackendConfig, Conversation
from embodied_r.evaluation.models import evaluation_folder
from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.evaluation.stage import evaluate_records, read_split, run_evaluation
from embodied_r.keyframes.extract import thin_evenly

BASELINES = ("policy", "vlm")
LABELS = {"policy": "untrained reasoning model", "vlm": "VLM on the key frames"}

VLM_PREAMBLE = "These are the key frames of an egocentric video, in order from the past to the present."
# VSI-Bench's own instructions to the models it evaluates.
VLM_CHOICE = "Answer with the option's letter from the given choices directly."
VLM_NUMBER = "Please answer the question using a single word or phrase."


def vlm_conversation(record: dict[str, Any], frames: list[str]) -> Conversation:
    instruction = VLM_NUMBER if record["answer_type"] == "number" else VLM_CHOICE
    content: list[dict[str, str]] = [{"type": "image", "path": p} for p in frames]
    content.append({"type": "text", "text": f"{VLM_PREAMBLE}\n{record['question']}\n{instruction}"})
    return [{"role": "user", "content": content}]


def frames_by_uid(catalog: Path, keyframes: Path, max_images: int) -> dict[str, list[str]]:
    """Each question's key-frame image paths, in order, at most ``max_images`` (evenly thinned)."""
    catalog, keyframes = Path(catalog), Path(keyframes)
    if catalog.is_dir():
        catalog = catalog / "catalog.parquet"
    for path, fix in ((catalog, "run the preprocess stage first"),
                      (keyframes / "keyframes.parquet", "run the keyframes stage first")):
        if not path.is_file():
            raise FileNotFoundError(f"VLM baseline: {path} does not exist ({fix})")
    by_video: dict[str, list[tuple[int, str]]] = {}
    for row in pq.read_table(keyframes / "keyframes.parquet", columns=["video_id", "rank", "image_path"]).to_pylist():
        by_video.setdefault(row["video_id"], []).append((row["rank"], str(keyframes / row["image_path"])))
    frames = {vid: thin_evenly([p for _, p in sorted(items)], max_images) for vid, items in by_video.items()}
    uids = pq.read_table(catalog, columns=["uid", "video_id"]).to_pylist()
    return {r["uid"]: frames.get(r["video_id"], []) for r in uids}


def run_policy_baseline(records: Path, policy: str, out: Path, cfg: EvaluationConfig) -> dict[str, Any]:
    return run_evaluation(records, policy, out, cfg, title=f"Baseline: {LABELS['policy']}")


def run_vlm_baseline(records: Path, catalog: Path, keyframes: Path, out: Path, vlm: BackendConfig,
                     cfg: EvaluationConfig, max_images: int = 32) -> dict[str, Any]:
    """Questions whose video has no key frames are failures, not wrong answers."""
    all_records = read_split(records, cfg.split)
    frames = frames_by_uid(catalog, keyframes, max_images)
    known = [r for r in all_records if frames.get(r["uid"])]
    # Decoding as the evaluation of the reasoner decodes (greedy by default).
    update = {"temperature": cfg.backend.temperature, "top_p": cfg.backend.top_p,
              "max_new_tokens": cfg.max_new_tokens or cfg.backend.max_new_tokens}
    # The VLM replies directly; its replies carry no reasoning for a judge to read.
    plain = cfg.model_copy(update={"consistency_judge": None})
    summary = evaluate_records(
        known, out, vlm.model_copy(update=update), plain, model_label=vlm.model,
        conversation=lambda r: vlm_conversation(r, frames[r["uid"]]), answer_from="reply",
        title=f"Baseline: {LABELS['vlm']}",
        extra_summary={"without_key_frames": len(all_records) - len(known)},
    )
    return summary


@dataclass
class BaselinePlan:
    name: str
    out: Path
    inputs: dict[str, str] = field(default_factory=dict)


def plan_baselines(recipe: Any, stages: Any) -> dict[str, BaselinePlan]:
    """Where each baseline writes, keyed like pipeline stages."""
    root = stages.root
    records = stages["convert"].out
    cfg = recipe.evaluation_settings()
    return {
        "policy": BaselinePlan("policy", evaluation_folder(
            root, "baseline_policy", {"policy": recipe.training.policy, "records": stages["convert"].key}, cfg),
            {"records": records, "policy": recipe.training.policy}),
        "vlm": BaselinePlan("vlm", evaluation_folder(
            root, "baseline_vlm", {"vlm": recipe.perception.backend.model_dump(mode="json"),
                                   "records": stages["convert"].key, "keyframes": stages["keyframes"].key,
                                   "max_images": recipe.keyframes.max_frames}, cfg),
            {"records": records, "catalog": str(Path(stages["preprocess"].out) / "catalog.parquet"),
             "keyframes": stages["keyframes"].out}),
    }


def run_baselines(recipe: Any, stages: Any, only: list[str] | None = None) -> dict[str, dict[str, Any]]:
    from embodied_r.errors import StageError

    unknown = sorted(set(only or []) - set(BASELINES))
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {list(BASELINES)}")
    plans = plan_baselines(recipe, stages)
    results: dict[str, dict[str, Any]] = {}
    for name in only or list(BASELINES):
        needed = ["convert"] + (["preprocess", "keyframes"] if name == "vlm" else [])
        missing = [s for s in needed if not stages[s].complete]
        if missing:
            raise StageError(f"the {name} baseline reads the {missing[0]} stage's output, which has not been run "
                             f"with recipe {recipe.name!r}: run `embodied-r {stages[missing[0]].kind} "
                             f"--recipe {recipe.name}` (or the whole pipeline) first")
        p = plans[name]
        if name == "policy":
            results[name] = run_policy_baseline(Path(p.inputs["records"]), p.inputs["policy"], p.out,
                                                recipe.evaluation_settings())
        else:
            results[name] = run_vlm_baseline(Path(p.inputs["records"]), Path(p.inputs["catalog"]),
                                             Path(p.inputs["keyframes"]), p.out, recipe.perception.backend,
                                             recipe.evaluation, max_images=recipe.keyframes.max_frames)
        results[name]["out"] = str(p.out)
    return results
