"""Batch inference in the original JSON format: text and video records, tiny models."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any, Iterator

import pytest

from embodied_r.backends.base import BackendConfig
from embodied_r.apps.cli_eval import main as cli_main
from embodied_r.apps.inference import parse_question, read_input, reasoning_conversation, run_inference
from embodied_r.errors import InferenceInputError
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.perception.config import PerceptionConfig
from embodied_r.training.records_config import RecordsConfig
from embodied_r.synthetic.world import write_motion_video
from tests.servers import ScriptedModels, text_of

DIRECTION = ("Please assume the role of an agent. Question: If I am standing by the sofa and facing the TV, "
             "is the lamp to my left, right, or back?\n\nChoices: \nA. left\nB. right\nC. back\n")
VIDEO_Q = ("<video>Please assume the role of an agent. The video shows what you saw on your way, oldest "
           "first. Question: Which object is the closest to the door?\n\nChoices: \n"
           "A. computer tower\nB. chair\nC. whiteboard\nD. telephone\n")


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("videos")
    return write_motion_video(folder / "clip.mp4", [("turn right", 3.0, 25.0), ("fly forward", 2.0, 1.3)], seed=4)


def _records(clip: Path) -> list[dict[str, Any]]:
    return [
        {"Question_id": "word_infer", "question_category": "object_rel_direction", "question": DIRECTION,
         "answer": "C"},
        {"Question_id": "video_infer", "question_category": "object_rel_distance", "question": VIDEO_Q,
         "answer": "C", "videos": clip.name},  # relative to the input file
        {"Question_id": "count", "question_category": "object_counting", "question": "<video>How many chairs?",
         "videos": [str(clip)]},
        {"Question_id": "broken", "question": "<video>What is ahead?", "videos": "missing.mp4"},
    ]


def _perception(tiny_vlm_path: Path) -> PerceptionConfig:
    return PerceptionConfig(backend=BackendConfig(kind="transformers", model=str(tiny_vlm_path), device="cpu",
                                                  batch_size=8, max_pixels=112 * 112), max_new_tokens=8)


KEYFRAMES = KeyframeConfig(max_frames=4, jpeg_max_side=160, workers=1)


def test_parse_question() -> None:
    q = parse_question(VIDEO_Q, "object_rel_distance")
    assert q.text == "Which object is the closest to the door?"
    assert q.options == ["A. computer tower", "B. chair", "C. whiteboard", "D. telephone"]
    assert q.answer_type == "choice"
    assert parse_question("<video>How many chairs are there?", "object_counting").answer_type == "number"
    assert parse_question("<video> Describe the route.").answer_type == "open"
    assert parse_question("Where is it?\nOptions:\nA. here\nB. there").options == ["A. here", "B. there"]


def test_reasoning_prompt_is_the_training_prompt() -> None:
    cfg = RecordsConfig()
    conv = reasoning_conversation(parse_question(VIDEO_Q), "Frame 0: Observe: a door.", cfg)
    assert conv[0] == {"role": "system", "content": cfg.system_prompt}
    user = conv[1]["content"]
    assert "Frame 0: Observe: a door." in user and "B. chair" in user and "<video>" not in user
    assert "letter of the one correct option" in user
    assert "give only the number" in reasoning_conversation(parse_question("<video>How far?", "object_abs_distance"),
                                                            "x", cfg)[1]["content"]
    assert "give your answer inside <answer>" in reasoning_conversation(parse_question("<video>Why?"), "x",
                                                                        cfg)[1]["content"]


@pytest.fixture()
def reasoner() -> Iterator[ScriptedModels]:
    server = ScriptedModels(lambda model, messages: f"<think>saw {len(text_of(messages))} chars</think>"
                                                    "<answer>B</answer>")
    yield server
    server.stop()


def test_both_record_kinds(clip: Path, tiny_vlm_path: Path, reasoner: ScriptedModels, tmp_path: Path) -> None:
    records = _records(clip)
    kwargs = dict(perception=_perception(tiny_vlm_path), keyframes=KEYFRAMES, records_cfg=RecordsConfig(),
                  work=tmp_path / "work", base=clip.parent, chunk_size=2)
    out = run_inference(records, reasoner=reasoner.backend("reasoner"), with_video_text=True, **kwargs)
    assert [r["Question_id"] for r in out] == ["word_infer", "video_infer", "count", "broken"]
    for given, got in zip(records, out):
        assert {k: got[k] for k in given} == given  # every input field passed through
    assert out[0]["content"].endswith("<answer>B</answer>") and "video_text" not in out[0]
    assert out[1]["content"].endswith("<answer>B</answer>") and out[1]["video_text"].startswith("Frame 0: Observe:")
    assert "Frame 3: After" in out[1]["video_text"]  # four key frames described
    assert out[3]["content"] == "" and "missing.mp4" in out[3]["error"]
    assert "error" not in out[0] and "error" not in out[1]

    sent = [text_of(r["messages"]) for r in reasoner.requests]
    assert len(sent) == 3
    text_turn = next(t for t in sent if "sofa" in t)
    assert DIRECTION in text_turn and "Frame 0" not in text_turn  # a text record goes as it is
    video_turn = next(t for t in sent if "closest to the door" in t)
    assert out[1]["video_text"] in video_turn and "A. computer tower" in video_turn
    assert "The video represents your egocentric" not in video_turn  # the template has its own preamble

    # A rerun in the same work folder repeats nothing: the reasoner here is unreachable.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = BackendConfig(kind="openai", model="x", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    again = run_inference(records, reasoner=dead, with_video_text=True, **kwargs)
    assert again[:3] == out[:3]


def test_bad_input_files_name_the_record(tmp_path: Path) -> None:
    cases = {"not_list.json": {"question": "x"}, "no_question.json": [{"question": "ok"}, {"videos": "a.mp4"}],
             "no_video.json": [{"question": "<video>What is here?"}]}
    messages = {"not_list.json": "JSON list", "no_question.json": "record 1", "no_video.json": "'videos'"}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_text(json.dumps(data))
        with pytest.raises(InferenceInputError, match=messages[name]):
            read_input(path)
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(InferenceInputError, match="not valid JSON"):
        read_input(tmp_path / "bad.json")


def test_infer_command_on_the_tiny_models(clip: Path, tiny_lm_path: Path, tiny_vlm_path: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.json"
    (tmp_path / clip.name).write_bytes(clip.read_bytes())  # beside the input file
    src.write_text(json.dumps(_records(clip)[:3]), encoding="utf-8")
    dst = tmp_path / "out" / "answers.json"
    # The smoke recipe's perceiver is the random tiny VLM.
    rc = cli_main(["infer", "--input", str(src), "--output", str(dst), "--model", "tiny:lm", "--recipe", "smoke",
                   "--max-new-tokens", "8", "--set", "keyframes.max_frames=4", "--set", "keyframes.workers=1"])
    assert rc == 0, capsys.readouterr()
    out = json.loads(dst.read_text(encoding="utf-8"))
    assert [r["Question_id"] for r in out] == ["word_infer", "video_infer", "count"]
    assert all(isinstance(r["content"], str) and r["content"] for r in out)
    assert "Wrote 3 records" in capsys.readouterr().out
    # A record with a <video> but no path is refused before any model is loaded.
    src.write_text(json.dumps([{"question": "<video>x"}]))
    assert cli_main(["infer", "--input", str(src), "--output", str(dst), "--model", "tiny:lm"]) == 2
    assert "'videos'" in capsys.readouterr().err
