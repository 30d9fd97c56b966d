"""The perception stage: a VLM turns each question's key frames into text, every call logged
the moment it finishes, so a killed run resumes without repeating or losing one; a question
whose call still fails is dropped (or kept on a placeholder) and counted."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from embodied_r import progress
from embodied_r.perception import prompts
from embodied_r.backends.base import Backend, BackendConfig, Generation
from embodied_r.backends.factory import make_backend
from embodied_r.errors import InfraFailure, WriteFailure, check_failed_fraction
from embodied_r.io import ItemLog, is_complete, item_done, read_summary, stage_folder, write_summary
from embodied_r.redaction import redact
from embodied_r.perception.modes import QUESTION_PHASE, Call, Question
from embodied_r.perception.outputs import check_actions, server_hint, without_keyframes, write_outputs
from embodied_r.perception.config import PerceptionConfig
from embodied_r.perception.prompts import PerceiverTexts
from embodied_r.shards import SHARD_INPUT, Sharding, parse_selection, run_sharded, summed

log = logging.getLogger(__name__)

STAGE = "perception"


def _read_inputs(catalog: Path, keyframes: Path,
                 texts: PerceiverTexts | None = None) -> tuple[list[Question], dict[str, list[str]]]:
    catalog, keyframes = Path(catalog), Path(keyframes)
    if not catalog.is_file():
        raise FileNotFoundError(f"catalog {catalog} not found: run the preprocess stage first")
    kf_file = keyframes / "keyframes.parquet"
    if not kf_file.is_file():
        raise FileNotFoundError(f"{kf_file} not found: point `keyframes` at a finished key-frame stage folder "
                                "(run the keyframes stage first)")
    cat = pq.read_table(catalog, columns=["uid", "video_id", "question", "options"]).to_pylist()
    rows = pq.read_table(kf_file, columns=["video_id", "rank", "image_path"]).to_pylist()
    by_video: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for row in rows:
        by_video[row["video_id"]].append((row["rank"], str(keyframes / row["image_path"])))
    frames = {vid: [p for _, p in sorted(items)] for vid, items in by_video.items()}
    questions = [Question(r["uid"], r["video_id"], prompts.question_with_options(r["question"], r["options"], texts))
                 for r in cat]
    if len({q.uid for q in questions}) != len(questions):
        raise ValueError(f"catalog {catalog} has duplicate uids: rebuild it with the preprocess stage")
    return questions, frames


def _valid_entry(rec: dict[str, Any]) -> bool:
    """A logged call that can be replayed; anything else is made again."""
    return (isinstance(rec.get("key"), str) and isinstance(rec.get("kind"), str)
            and isinstance(rec.get("raw"), str)
            and all(isinstance(rec.get(k), int) and rec[k] >= 0 for k in ("prompt_tokens", "completion_tokens")))


def _chunk_size(cfg: BackendConfig) -> int:
    # Enough to fill a batch in process and keep every connection busy; results are logged
    # as they finish, so a larger chunk only bounds how much is prepared at once.
    return max(cfg.batch_size, 16 * cfg.concurrency * max(1, len(cfg.urls())))


class _Runner:
    def __init__(self, backend: Backend, item_log: ItemLog, done: dict[str, dict[str, Any]],
                 structured: bool, send_after_failure: bool = False):
        self.backend = backend
        self.item_log = item_log
        self.done = done
        self.structured = structured
        # keep_placeholder: a failed call's question is kept, so the calls after it are worth sending.
        self.send_after_failure = send_after_failure
        self.errors: dict[str, str] = {}
        self.outage: str | None = None
        self.unwritable: WriteFailure | None = None
        self.made = self.failed = self.skipped = 0
        self.total = 0  # calls of the whole stage, for progress
        self._lock = threading.Lock()

    def _record(self, call: Call, gen: Generation) -> None:
        with self._lock:
            self.made += 1
            if gen.error is not None:
                # Not logged: a later run of an unfinished stage tries the call again.
                self.failed += 1
                self.errors[call.key] = redact(gen.error) or ""
                if gen.infra_failed and self.outage is None:
                    self.outage = f"call {call.key}: {self.errors[call.key]}"
                return
        rec = {"key": call.key, "kind": call.kind, "raw": gen.text, "prompt_tokens": gen.prompt_tokens,
               "completion_tokens": gen.completion_tokens}
        if gen.truncated:
            rec["truncated"] = True
        try:
            self.item_log.append(rec)
        except WriteFailure as exc:
            # Raised here it would reach the event loop once per call in flight; stop once, after.
            with self._lock:
                self.unwritable = self.unwritable or exc
            return
        item_done("perception")
        with self._lock:
            self.done[call.key] = rec
            finished = len(self.done)
        progress.update("perception", finished, self.total)

    def _skipped(self, call: Call) -> bool:
        """Not worth sending: a call it needs failed (or was skipped) in this run."""
        failed = next((k for k in call.needs if k in self.errors), None)
        if failed is None or self.send_after_failure:
            return False
        self.errors[call.key] = f"not sent: {failed} failed"
        self.skipped += 1
        return True

    def run(self, calls: list[Call], size: int, max_new_tokens: int) -> None:
        for start in range(0, len(calls), size):
            chunk = [c for c in calls[start : start + size] if not self._skipped(c)]
            if not chunk:
                continue
            reported: set[int] = set()

            def on_result(i: int, gen: Generation, chunk: list[Call] = chunk) -> None:
                reported.add(i)
                self._record(chunk[i], gen)

            gens = self.backend.generate([c.conversation for c in chunk],
                                         schemas=[c.schema for c in chunk] if self.structured else None,
                                         max_new_tokens=max_new_tokens, on_result=on_result)
            for i, gen in enumerate(gens):
                if i not in reported:
                    self._record(chunk[i], gen)
            if self.unwritable is not None:
                raise WriteFailure(f"perception stopped: {self.unwritable}") from self.unwritable
            if self.outage is not None:
                raise InfraFailure(
                    f"perception stopped: the perceiver failed ({self.outage[:400]}). Finished calls are "
                    "kept; run again once the server answers, and only the missing calls are sent")
            log.info("perception: %d/%d calls", start + len(chunk), len(calls))


# Per-run counters of the work phase: a merge of shards adds them up.
RUN_COUNTERS = ("calls_made", "calls_failed", "calls_skipped", "retries", "structured_output_refused")


def _split(questions: list[Question], frames: dict[str, list[str]]) -> tuple[list[Question], dict[str, str]]:
    failures: dict[str, str] = {}
    ready: list[Question] = []
    for q in questions:
        q.frames = frames.get(q.video_id, [])
        if not q.frames:
            failures[q.uid] = f"no key frames for video {q.video_id}"
        else:
            ready.append(q)
    return ready, failures


def _work(work: Path, ready: list[Question], cfg: PerceptionConfig, catalog: Path) -> dict[str, Any]:
    """The calls missing from ``work``'s item log: the run's counters and the failed calls' errors."""
    item_log = ItemLog(work / "items.jsonl", key="key", validate=_valid_entry)
    done = {rec["key"]: rec for rec in item_log.read()}
    calls = cfg.plan().calls(ready)
    pending = [c for c in calls if c.key not in done]
    progress.keep(len(done))
    stats: dict[str, Any] = {k: 0 for k in RUN_COUNTERS}
    if not pending:
        return {**stats, "errors": {}, "done": len(done), "failed": 0}
    backend_cfg = cfg.backend.model_copy(update={"max_new_tokens": cfg.max_new_tokens})
    backend: Backend = make_backend(backend_cfg, catalog=catalog)
    try:
        runner = _Runner(backend, item_log, done, cfg.structured_output,
                         send_after_failure=cfg.on_failure == "keep_placeholder")
        runner.total = len(calls)
        size = _chunk_size(backend_cfg)
        runner.run([c for c in pending if c.kind != QUESTION_PHASE], size, cfg.max_new_tokens)
        runner.run([c for c in pending if c.kind == QUESTION_PHASE], size, cfg.question_max_new_tokens)
    finally:
        backend.close()
    stats.update(calls_made=runner.made, calls_failed=runner.failed, calls_skipped=runner.skipped,
                 retries=len(getattr(backend, "retry_log", [])),
                 structured_output_refused=int(bool(getattr(backend, "structured_output_refused", False))))
    # A shard's done and failed count its calls (logged, and failed or not sent).
    return {**stats, "errors": runner.errors, "done": len(done), "failed": len(runner.errors)}


def _finish(work: Path, questions: list[Question], ready: list[Question], failures: dict[str, str],
            cfg: PerceptionConfig, run: dict[str, Any], keyframes: Path) -> dict[str, Any]:
    mode = cfg.plan()
    item_log = ItemLog(work / "items.jsonl", key="key", validate=_valid_entry)
    done = {rec["key"]: rec for rec in item_log.read()}
    summary = write_outputs(work, mode, ready, mode.calls(ready), done, dict(run["errors"]), failures,
                            len(questions), cfg.question_label, cfg.on_failure)
    summary.update({k: run[k] for k in RUN_COUNTERS})
    summary["structured_output"] = cfg.structured_output
    summary["reply_format"] = cfg.reply_format
    summary["on_failure"] = cfg.on_failure
    # A question kept on a placeholder counts against the limit as a dropped one does.
    check_failed_fraction(STAGE, summary["failed"] + summary["questions_with_placeholder"], len(questions),
                          cfg.max_failed_fraction, f"reasons {summary['reasons']}; see failures.parquet"
                          f"{server_hint(cfg, summary)}{without_keyframes(questions, failures, keyframes)}")
    check_actions(cfg, summary, work)
    return summary


def run_perception(catalog: Path, keyframes: Path, out: Path, cfg: PerceptionConfig,
                   shard: int | None = None) -> dict[str, Any]:
    """Sharded by video (``shard``: only that one, 0-based), so a video's shared calls stay together."""
    out = Path(out)
    if is_complete(out):
        return read_summary(out)
    if cfg.texts_required and cfg.texts is None:
        raise ValueError("perception: this recipe needs the original texts and names no prompts file: write it with "
                         "`embodied-r prompts import-official PATH` (PATH: your clone of EmbodiedCity/Embodied-R.code) "
                         "and run again with --set prompts.file=FILE")
    questions, frames = _read_inputs(catalog, keyframes, cfg.texts)
    ready, failures = _split(questions, frames)
    if cfg.shards > 1:
        def mine(videos: list[str]) -> list[Question]:
            chosen = set(videos)
            return [q for q in ready if q.video_id in chosen]

        def finish(work: Path, shards: list[dict[str, Any]]) -> dict[str, Any]:
            run = summed(shards, RUN_COUNTERS)
            run["structured_output_refused"] = max(s["structured_output_refused"] for s in shards)
            run["errors"] = {k: v for s in shards for k, v in s["errors"].items()}
            return _finish(work, questions, ready, failures, cfg, run, keyframes)

        pin = cfg.model_copy(update={"backend": cfg.backend.pin(shard)})
        return run_sharded(out, cfg.shards, Sharding(
            ids=list(dict.fromkeys(q.video_id for q in ready)), finish=finish, log_key="key",
            work=lambda work, videos: _work(work, mine(videos), pin, catalog),
            log_keys=lambda videos: {c.key for c in cfg.plan().calls(mine(videos))}), shard)
    with stage_folder(out) as work:
        summary = _finish(work, questions, ready, failures, cfg, _work(work, ready, cfg, catalog), keyframes)
        write_summary(work, summary)
    return summary


def run_stage(out: Path, config: dict[str, Any], inputs: dict[str, str],
              mlflow_run_id: str | None = None) -> dict[str, Any]:
    cfg = PerceptionConfig.model_validate(config)
    return run_perception(Path(inputs["catalog"]), Path(inputs["keyframes"]), out, cfg,
                          parse_selection(inputs.get(SHARD_INPUT), cfg.shards))
