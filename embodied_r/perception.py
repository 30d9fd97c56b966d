"""The perception stage: a large VLM turns each question's key frames into text.

Per question, frame 0 is described alone and every later key frame is compared with the
one before it (see ``prompts``). The calls of a question do not depend on each other, so
the stage sends the same round (frame index) of many questions together, questions of
one video side by side, letting the backend batch them and a server reuse the cached
image prefix. Every finished call is logged at once; a killed run resumes without
repeating a finished call or losing one.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from embodied_r import prompts, schemas
from embodied_r.backends import Backend, BackendConfig, make_backend
from embodied_r.io import (
    ItemLog,
    is_complete,
    read_summary,
    stage_folder,
    table_from_records,
    write_parquet_atomic,
    write_summary,
)

log = logging.getLogger(__name__)

STAGE = "perception"
SUPPORTED_PROMPT_VERSIONS = {prompts.PROMPT_VERSION}


def _paper_perceiver() -> BackendConfig:
    # The paper's perceiver, a 72B VLM, is served (e.g. `vllm serve`) rather than loaded
    # in process; recipes point base_url elsewhere or swap the backend.
    return BackendConfig(
        kind="openai",
        model="Qwen/Qwen2.5-VL-72B-Instruct",
        base_url="http://127.0.0.1:8000/v1",
        max_new_tokens=512,
    )


class PerceptionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: BackendConfig = Field(default_factory=_paper_perceiver)
    mode: Literal["per_question"] = "per_question"
    max_new_tokens: int = Field(512, ge=1)
    prompt_version: str = prompts.PROMPT_VERSION

    @field_validator("prompt_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if value not in SUPPORTED_PROMPT_VERSIONS:
            raise ValueError(
                f"prompt_version {value!r} is not available in this code "
                f"(available: {sorted(SUPPORTED_PROMPT_VERSIONS)})"
            )
        return value


@dataclass
class _Question:
    uid: str
    video_id: str
    text: str
    frames: list[str] = field(default_factory=list)  # absolute key-frame image paths

    def call(self, frame: int) -> list[dict[str, Any]]:
        if frame == 0:
            return prompts.first_frame_conversation(self.frames[0], self.text)
        return prompts.pair_conversation(self.frames[frame - 1], self.frames[frame], self.text)


def _key(uid: str, frame: int) -> str:
    return f"{uid}:{frame}"


def _read_inputs(catalog: Path, keyframes: Path) -> tuple[list[_Question], dict[str, list[str]]]:
    catalog, keyframes = Path(catalog), Path(keyframes)
    if not catalog.is_file():
        raise FileNotFoundError(f"catalog {catalog} not found: run the preprocess stage first")
    kf_file = keyframes / "keyframes.parquet"
    if not kf_file.is_file():
        raise FileNotFoundError(
            f"{kf_file} not found: point `keyframes` at a finished key-frame stage folder "
            "(run the keyframes stage first)"
        )
    cat = pq.read_table(catalog, columns=["uid", "video_id", "question", "options"]).to_pylist()
    rows = pq.read_table(kf_file, columns=["video_id", "rank", "image_path"]).to_pylist()
    by_video: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for row in rows:
        by_video[row["video_id"]].append((row["rank"], str(keyframes / row["image_path"])))
    frames = {vid: [p for _, p in sorted(items)] for vid, items in by_video.items()}
    questions = [
        _Question(
            uid=r["uid"],
            video_id=r["video_id"],
            text=prompts.question_with_options(r["question"], r["options"]),
        )
        for r in cat
    ]
    if len({q.uid for q in questions}) != len(questions):
        raise ValueError(f"catalog {catalog} has duplicate uids: rebuild it with the preprocess stage")
    return questions, frames


def _chunk_size(cfg: BackendConfig) -> int:
    # Enough calls per generate() to fill a batch in process or the connection pool over HTTP.
    return max(cfg.batch_size, cfg.concurrency)


def run_perception(catalog: Path, keyframes: Path, out: Path, cfg: PerceptionConfig) -> dict[str, Any]:
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    questions, frames = _read_inputs(catalog, keyframes)

    with stage_folder(out) as work:
        item_log = ItemLog(work / "items.jsonl", key="key")
        done = {rec["key"]: rec for rec in item_log.read()}
        failures: dict[str, str] = {}
        ready: list[_Question] = []
        for q in questions:
            q.frames = frames.get(q.video_id, [])
            if not q.frames:
                failures[q.uid] = f"no key frames for video {q.video_id}"
            else:
                ready.append(q)

        pending = [
            (q, f) for q in ready for f in range(len(q.frames)) if _key(q.uid, f) not in done
        ]
        # Round by round, and within a round video by video, for batching and prefix reuse.
        pending.sort(key=lambda item: (item[1], item[0].video_id, item[0].uid))
        errors: dict[str, str] = {}
        calls_made = 0
        if pending:
            backend_cfg = cfg.backend.model_copy(update={"max_new_tokens": cfg.max_new_tokens})
            backend: Backend = make_backend(backend_cfg)
            try:
                size = _chunk_size(backend_cfg)
                for start in range(0, len(pending), size):
                    chunk = pending[start : start + size]
                    gens = backend.generate([q.call(f) for q, f in chunk])
                    for (q, f), gen in zip(chunk, gens):
                        calls_made += 1
                        if gen.error is not None:
                            # Not logged: a later run tries the call again.
                            errors.setdefault(q.uid, f"frame {f}: {gen.error}")
                            continue
                        rec = {
                            "key": _key(q.uid, f),
                            "uid": q.uid,
                            "frame": f,
                            "raw": gen.text,
                            "prompt_tokens": gen.prompt_tokens,
                            "completion_tokens": gen.completion_tokens,
                        }
                        item_log.append(rec)
                        done[rec["key"]] = rec
                    log.info("perception: %d/%d calls", start + len(chunk), len(pending))
            finally:
                backend.close()

        summary = _write_outputs(work, ready, done, errors, failures, calls_made, len(questions))
        write_summary(work, summary)
    return summary


def _reason_kind(reason: str) -> str:
    return "no_keyframes" if reason.startswith("no key frames") else "call_failed"


def _write_outputs(
    work: Path,
    ready: list[_Question],
    done: dict[str, dict[str, Any]],
    errors: dict[str, str],
    failures: dict[str, str],
    calls_made: int,
    n_questions: int,
) -> dict[str, Any]:
    rows, frame_rows = [], []
    for q in ready:
        recs = [done.get(_key(q.uid, f)) for f in range(len(q.frames))]
        if any(r is None for r in recs):
            failures[q.uid] = "call failed after retries: " + errors.get(q.uid, "missing result")[:500]
            continue
        infos = [prompts.parse_frame_response(r["raw"], first=f == 0) for f, r in enumerate(recs)]
        for f, (r, info) in enumerate(zip(recs, infos)):
            frame_rows.append(
                {
                    "uid": q.uid,
                    "frame": f,
                    "action": info.action,
                    "new_info": info.new_info,
                    "question_info": info.question_info,
                    "raw": r["raw"],
                }
            )
        rows.append(
            {
                "uid": q.uid,
                "video_text": prompts.video_text(infos),
                "n_frames": len(recs),
                "n_calls": len(recs),
                "prompt_tokens": sum(int(r["prompt_tokens"]) for r in recs),
                "completion_tokens": sum(int(r["completion_tokens"]) for r in recs),
            }
        )
    write_parquet_atomic(table_from_records(rows, schemas.PERCEPTION), work / "perception.parquet")
    write_parquet_atomic(
        table_from_records(frame_rows, schemas.PERCEPTION_FRAMES), work / "perception_frames.parquet"
    )
    fail_rows = [{"stage": STAGE, "item": uid, "reason": why} for uid, why in sorted(failures.items())]
    write_parquet_atomic(table_from_records(fail_rows, schemas.FAILURES), work / "failures.parquet")
    unknown = sum(1 for r in frame_rows if r["frame"] > 0 and r["action"] == prompts.UNKNOWN_ACTION)
    later = sum(1 for r in frame_rows if r["frame"] > 0)
    return {
        "stage": STAGE,
        "prompt_version": prompts.PROMPT_VERSION,
        "items": n_questions,
        "questions": n_questions,
        "done": len(rows),
        "failed": len(failures),
        "reasons": dict(Counter(_reason_kind(r) for r in failures.values())),
        "calls": sum(r["n_calls"] for r in rows),
        "calls_made": calls_made,
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "completion_tokens": sum(r["completion_tokens"] for r in rows),
        "mean_frames": (sum(r["n_frames"] for r in rows) / len(rows)) if rows else 0.0,
        "unknown_action_rate": (unknown / later) if later else 0.0,
    }
