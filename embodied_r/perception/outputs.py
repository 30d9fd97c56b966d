"""What the perception stage writes once its calls are made (``perception.parquet``, the
frames' parsed fields beside the raw replies, failures and the summary), and the checks that
name a served perceiver whose replies are unusable, since the fix is on the server."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from embodied_r import schemas
from embodied_r.errors import StageFault
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.perception import prompts
from embodied_r.perception.modes import FAILED, Assembled, Call, Question
from embodied_r.perception.parse import video_text

STAGE = "perception"


def server_name(cfg: Any) -> str:
    return f"{cfg.backend.servers_text()} (model {cfg.backend.model!r})"


def server_hint(cfg: Any, summary: dict[str, Any]) -> str:
    reasons = summary["reasons"]
    if not cfg.backend.served or set(reasons) != {"empty_reply"}:
        return ""
    return (f". The perceiver at {server_name(cfg)} answers with no text: if it is a reasoning model, turn its "
            "reasoning parser off or serve a model that answers in the message content")


def check_actions(cfg: Any, summary: dict[str, Any], work: Path) -> None:
    if not cfg.backend.served or summary["unknown_action_rate"] < 1.0 or not summary["done"]:
        return
    raise StageFault(
        f"perception: none of the replies from the perceiver at {server_name(cfg)} names an action "
        f"(unknown_action_rate 1.0; replies in {work / 'perception_frames.parquet'}): serve a vision-language "
        "model that reads the images and answers in the prompt's points, then rerun with --refresh perception")


# Videos named on the line of a stage stopped by them; the file named beside lists them all.
SHOWN_VIDEOS = 3


def without_keyframes(questions: list[Question], failures: dict[str, str], keyframes: Path) -> str:
    """The videos without key frames that questions here failed on, and the file where the
    key-frame stage says why: the fix is in those videos."""
    videos = list(dict.fromkeys(q.video_id for q in questions if q.uid in failures and not q.frames))
    if not videos:
        return ""
    shown = ", ".join(videos[:SHOWN_VIDEOS]) + (f" and {len(videos) - SHOWN_VIDEOS} more" if len(videos) > SHOWN_VIDEOS
                                                else "")
    return (f"; {len(videos)} video(s) have no key frames ({shown}): the key-frame stage left them out, "
            f"with why, in {keyframes / 'failures.parquet'}")


def _reason_kind(reason: str) -> str:
    if reason.startswith("no key frames"):
        return "no_keyframes"
    return "empty_reply" if "empty_reply" in reason else "call_failed"


def write_outputs(work: Path, mode: Any, ready: list[Question], calls: list[Call], done: dict[str, dict[str, Any]],
                  errors: dict[str, str], failures: dict[str, str], n_questions: int, question_label: str = "",
                  on_failure: str = "drop") -> dict[str, Any]:
    rows, frame_rows, parsed_as, with_placeholder = _assemble(mode, ready, done, errors, failures, question_label,
                                                              on_failure)
    write_parquet_atomic(table_from_records(rows, schemas.PERCEPTION), work / "perception.parquet")
    write_parquet_atomic(table_from_records(frame_rows, schemas.PERCEPTION_FRAMES), work / "perception_frames.parquet")
    fail_rows = [{"stage": STAGE, "item": uid, "reason": why} for uid, why in sorted(failures.items())]
    write_parquet_atomic(table_from_records(fail_rows, schemas.FAILURES), work / "failures.parquet")
    return _summary(mode, calls, done, failures, n_questions, rows, frame_rows, parsed_as, with_placeholder)


def _assemble(mode: Any, ready: list[Question], done: dict[str, dict[str, Any]], errors: dict[str, str],
              failures: dict[str, str], question_label: str, on_failure: str
              ) -> tuple[list[dict], list[dict], Counter[str], int]:
    """Each question's row and its frames' rows; a question a call failed for goes to ``failures``."""
    rows, frame_rows = [], []
    parsed_as: Counter[str] = Counter()
    # keep_placeholder: a call that failed after its retries stands as the placeholder text
    # (as the official code kept its question); a call never made still drops the question.
    failed = set(errors) if on_failure == "keep_placeholder" else set()
    with_placeholder = 0
    for q in ready:
        built: Assembled | str = mode.assemble(q, done, failed)
        if isinstance(built, str):
            why = errors.get(built, "no result")
            failures[q.uid] = f"call {built} failed after retries: {why}"[:600]
            continue
        with_placeholder += any(info.parsed_as == FAILED for info in built.infos)
        for f, (info, raw) in enumerate(zip(built.infos, built.raws)):
            parsed_as[info.parsed_as] += 1
            frame_rows.append({"uid": q.uid, "frame": f, "action": info.action, "new_info": info.new_info,
                               "question_info": info.question_info, "raw": raw})
        recs = [done[k] for k in built.keys]
        rows.append({"uid": q.uid, "video_text": video_text(built.infos, question_label), "n_frames": len(built.infos),
                     "n_calls": len(recs), "prompt_tokens": sum(int(r["prompt_tokens"]) for r in recs),
                     "completion_tokens": sum(int(r["completion_tokens"]) for r in recs)})
    return rows, frame_rows, parsed_as, with_placeholder


def _summary(mode: Any, calls: list[Call], done: dict[str, dict[str, Any]], failures: dict[str, str],
             n_questions: int, rows: list[dict], frame_rows: list[dict], parsed_as: Counter[str],
             with_placeholder: int) -> dict[str, Any]:
    # Every logged call this catalog needs, once, whichever run made it: what it cost.
    logged = [(c, done[c.key]) for c in calls if c.key in done]
    unknown = sum(1 for r in frame_rows if r["frame"] > 0 and r["action"] == prompts.UNKNOWN_ACTION)
    later = sum(1 for r in frame_rows if r["frame"] > 0)
    return {
        "stage": STAGE, "mode": mode.name, "prompt_version": prompts.PROMPT_VERSION,
        "items": n_questions, "questions": n_questions, "done": len(rows), "failed": len(failures),
        # Counted apart from the failed (dropped) questions, never hidden among the done ones.
        "questions_with_placeholder": with_placeholder, "placeholder_frames": parsed_as[FAILED],
        "reasons": dict(Counter(_reason_kind(r) for r in failures.values())),
        "calls": len(logged), "calls_needed": len(calls), "calls_by_kind": dict(Counter(c.kind for c, _ in logged)),
        "calls_per_question": len(logged) / n_questions if n_questions else 0.0,
        "prompt_tokens": sum(int(r["prompt_tokens"]) for _, r in logged),
        "completion_tokens": sum(int(r["completion_tokens"]) for _, r in logged),
        "mean_frames": (sum(r["n_frames"] for r in rows) / len(rows)) if rows else 0.0,
        "unknown_action_rate": (unknown / later) if later else 0.0,
        "replies_truncated": sum(1 for _, r in logged if r.get("truncated")),
        "parsed_as": dict(parsed_as),
    }
