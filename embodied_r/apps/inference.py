"""Batch inference on the original project's JSON records: a ``<video>`` question is perceived
from its video's key frames and answered from that text with the training prompt, a text one
under the system prompt alone; each record comes back with ``content`` (or ``error``) added.
Per-record logs in a keyed work folder let an interrupted run resume."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodied_r.errors import InferenceInputError
from embodied_r.perception import prompts
from embodied_r.backends.base import Backend, BackendConfig, Conversation
from embodied_r.backends.factory import make_backend
from embodied_r.benchmarks import urbanvideo, vsibench
from embodied_r.io import KEY_HEX, ItemLog, keyed_folder, sha256_file, text_key, write_json_atomic, write_text_atomic
from embodied_r.keyframes.extract import extract_keyframes
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.perception.config import PerceptionConfig
from embodied_r.perception.modes import QUESTION_PHASE, Question
from embodied_r.training.records import build_record
from embodied_r.training.records_config import RecordsConfig

VIDEO_TAG = "<video>"
# The original's video questions open with an agent role sentence and one sentence on the
# video; the reasoning template has its own, so both go.
_ORIGINAL_PREAMBLE = re.compile(r"^\s*Please assume the role of an agent\.\s*(The video [^.?]*\.\s*)?", re.IGNORECASE)
OPEN_INSTRUCTION = (
    "Think about the question inside <think> </think>, then give your answer inside <answer> </answer>."
)


@dataclass
class VideoQuestion:
    text: str  # stem without the tag, preamble or option lines
    options: list[str]
    answer_type: str  # "choice" | "number" | "open"

    @property
    def with_options(self) -> str:
        return prompts.question_with_options(self.text, self.options)


def is_video_record(record: dict[str, Any]) -> bool:
    return str(record.get("question", "")).lstrip().startswith(VIDEO_TAG)


def parse_question(question: str, category: str | None = None) -> VideoQuestion:
    """Tag and the original's preamble removed, options split off, its kind from the options or
    the category."""
    text = question.lstrip()
    if text.startswith(VIDEO_TAG):
        text = text[len(VIDEO_TAG):]
    text = _ORIGINAL_PREAMBLE.sub("", text)
    stem, options = urbanvideo.split_question(text)
    if category in vsibench.NUMERIC:
        kind, options = "number", []
    elif len(options) >= 2:
        kind = "choice"
    else:
        kind, options = "open", []
    return VideoQuestion(stem, options, kind)


def reasoning_conversation(question: VideoQuestion, video_text: str, cfg: RecordsConfig) -> Conversation:
    """Built by ``records.build_record``, as for training."""
    if question.answer_type == "open":
        # An open question takes the choice slot of the template with an open instruction.
        cfg = cfg.model_copy(update={"choice_instruction": OPEN_INSTRUCTION})
    row = {"uid": "", "benchmark": "", "category": "", "split": "", "question": question.text,
           "options": question.options, "answer": "",
           "answer_type": "number" if question.answer_type == "number" else "choice"}
    record = build_record(row, video_text, cfg)
    return [{"role": "system", "content": record["system"]}, {"role": "user", "content": record["prompt"]}]


def keyframe_images(video: Path, folder: Path, cfg: KeyframeConfig) -> list[str]:
    """Key frames of ``video`` as JPEG files in ``folder``, reused when already written."""
    folder = Path(folder)
    listing = folder / "frames.json"
    if listing.is_file():
        return [str(folder / name) for name in json.loads(listing.read_text())]
    result = extract_keyframes(video, cfg)
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for rank, (index, jpg) in enumerate(zip(result.indices, result.images or [])):
        name = f"{rank:03d}_{index:06d}.jpg"
        (folder / name).write_bytes(jpg)
        names.append(name)
    write_json_atomic(listing, names)  # last: its presence means the frames are complete
    return [str(folder / name) for name in names]


def perceive(backend: Backend, questions: list[Question], cfg: PerceptionConfig) -> dict[str, tuple[str, str | None]]:
    """{uid: (video text, error or None)} by the perception stage's own calls and parsing; a
    phase's calls are sent together so the backend can batch them."""
    mode = cfg.plan()
    calls = mode.calls(questions)
    done: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for phase, budget in ((False, cfg.max_new_tokens), (True, cfg.question_max_new_tokens)):
        part = [c for c in calls if (c.kind == QUESTION_PHASE) == phase]
        if not part:
            continue
        gens = backend.generate([c.conversation for c in part],
                                schemas=[c.schema for c in part] if cfg.structured_output else None,
                                max_new_tokens=budget)
        for call, gen in zip(part, gens):
            if gen.error is not None:
                errors[call.key] = gen.error
            else:
                done[call.key] = {"raw": gen.text}
    out: dict[str, tuple[str, str | None]] = {}
    for q in questions:
        assembled = mode.assemble(q, done)
        if isinstance(assembled, str):
            out[q.uid] = ("", f"perception call {assembled} failed: {errors.get(assembled, 'no reply')}")
        else:
            out[q.uid] = (cfg.video_text(assembled.infos), None)
    return out


def perceiver_backend(cfg: PerceptionConfig) -> Backend:
    return make_backend(cfg.backend.model_copy(update={"max_new_tokens": cfg.max_new_tokens}))


def read_input(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"infer: input file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InferenceInputError(f"infer: {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise InferenceInputError(f"infer: {path} must hold a JSON list of records, not {type(data).__name__}")
    for i, rec in enumerate(data):
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str) or not rec["question"].strip():
            raise InferenceInputError(f"infer: record {i} of {path} needs a non-empty string 'question'")
        if is_video_record(rec) and not _video_field(rec):
            raise InferenceInputError(
                f"infer: record {i} of {path} asks about a <video> but has no 'videos' path; add one, "
                "or drop the <video> tag to ask it as text")
    return data


def _video_field(record: dict[str, Any]) -> str | None:
    videos = record.get("videos")
    if isinstance(videos, list):
        videos = videos[0] if len(videos) == 1 else None
    return videos if isinstance(videos, str) and videos.strip() else None


def _video_path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve()
    return (base / path).resolve()  # relative to the input file when not found from here


def write_output(path: Path, records: list[dict[str, Any]]) -> None:
    write_text_atomic(path, json.dumps(records, ensure_ascii=False, indent=4) + "\n")


def video_key(video: Path) -> str:
    """Its content, not its path: a file replaced at the same path is never answered from the
    old one's key frames and text."""
    video = Path(video)
    try:
        stat = video.stat()
    except OSError:
        return "missing-" + text_key(str(video))
    memo = (str(video), stat.st_size, stat.st_mtime_ns)
    if memo not in _VIDEO_KEYS:
        _VIDEO_KEYS[memo] = sha256_file(video)[:KEY_HEX]
    return _VIDEO_KEYS[memo]


_VIDEO_KEYS: dict[tuple[str, int, int], str] = {}


def work_folder(root: Path, records: list[dict[str, Any]], *configs: Any, base: Path | None = None) -> Path:
    """Keyed by the batch's records, configs and the content of its videos."""
    videos = [video_key(_video_path(v, base or Path("."))) if (v := _video_field(r)) else "" for r in records]
    return keyed_folder(Path(root) / "inference", [records, [c.model_dump(mode="json") for c in configs], videos])


def run_inference(records: list[dict[str, Any]], *, reasoner: BackendConfig, perception: PerceptionConfig,
                  keyframes: KeyframeConfig, records_cfg: RecordsConfig, work: Path, base: Path = Path("."),
                  chunk_size: int = 16, with_video_text: bool = False) -> list[dict[str, Any]]:
    work = Path(work)
    seen = ItemLog(work / "perception.jsonl", key="index")
    answered = ItemLog(work / "answers.jsonl", key="index")
    texts = {int(r["index"]): r for r in seen.read()}
    answers = {int(r["index"]): r for r in answered.read()}
    video_ids = [i for i, r in enumerate(records) if is_video_record(r) and i not in texts]
    if video_ids:
        _perceive_videos(records, video_ids, texts, seen, perception, keyframes, work, base, chunk_size)
    pending = [i for i in range(len(records)) if i not in answers and not (texts.get(i) or {}).get("error")]
    if pending:
        backend = make_backend(reasoner)
        try:
            for start in range(0, len(pending), chunk_size):
                part = pending[start : start + chunk_size]
                conversations = [_reasoning_turns(records[i], texts.get(i), records_cfg) for i in part]
                for i, gen in zip(part, backend.generate(conversations)):
                    answers[i] = {"index": i, "content": gen.text, "error": gen.error}
                    if gen.error is None:
                        answered.append(answers[i])
        finally:
            backend.close()
    out = []
    for i, record in enumerate(records):
        error = (texts.get(i) or {}).get("error") or (answers.get(i) or {}).get("error")
        result = {**record, "content": "" if error else answers[i]["content"]}
        if error:
            result["error"] = error
        if with_video_text and is_video_record(record):
            result["video_text"] = (texts.get(i) or {}).get("video_text", "")
        out.append(result)
    return out


def _perceive_videos(records: list[dict[str, Any]], video_ids: list[int], texts: dict[int, dict[str, Any]],
                     seen: ItemLog, perception: PerceptionConfig, keyframes: KeyframeConfig, work: Path, base: Path,
                     chunk_size: int) -> None:
    """Each video record's perception text into ``texts``, logged to ``seen`` when it succeeded."""
    questions: list[Question] = []
    for i in video_ids:
        video = _video_path(_video_field(records[i]) or "", base)
        key = video_key(video)
        try:
            frames = keyframe_images(video, work / "frames" / key, keyframes)
        except Exception as exc:  # noqa: BLE001 - one unreadable video fails its record only
            texts[i] = {"index": i, "video_text": "", "error": f"key frames: {exc}"}
            continue
        text = parse_question(records[i]["question"], records[i].get("question_category")).with_options
        questions.append(Question(uid=str(i), video_id=key, text=text, frames=frames))
    questions.sort(key=lambda q: q.video_id)  # a video's questions together share its calls
    backend = perceiver_backend(perception) if questions else None
    try:
        for start in range(0, len(questions), chunk_size):
            part = questions[start : start + chunk_size]
            for uid, (text, error) in perceive(backend, part, perception).items():
                texts[int(uid)] = {"index": int(uid), "video_text": text, "error": error}
                if error is None:  # failures are not logged: a rerun tries them again
                    seen.append(texts[int(uid)])
    finally:
        if backend is not None:
            backend.close()


def _reasoning_turns(record: dict[str, Any], seen: dict[str, Any] | None, cfg: RecordsConfig) -> Conversation:
    if seen is None:  # a text record: the question is the whole user turn
        return [{"role": "system", "content": cfg.system_prompt}, {"role": "user", "content": record["question"]}]
    question = parse_question(record["question"], record.get("question_category"))
    return reasoning_conversation(question, seen["video_text"], cfg)
