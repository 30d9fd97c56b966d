"""``embodied-r chat`` driven as a terminal program through a pseudo-terminal."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pexpect
import pytest

from embodied_r.apps.chat import Turn, show_turn
from embodied_r.synthetic.world import write_motion_video
from tests.servers import ScriptedModels, text_of

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 240  # a cold start loads torch and two models; never a measured figure


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("chat_video")
    return write_motion_video(folder / "walk.mp4", [("turn left", 3.0, 25.0), ("fly forward", 2.0, 1.3)], seed=7)


def _spawn(args: list[str], home: Path, color: bool = False) -> tuple[pexpect.spawn, io.StringIO]:
    env = {**os.environ, "EMBODIED_R_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "EMBODIED_R_TEST_KEY": "k"}
    env.pop("NO_COLOR", None)
    if not color:
        env["NO_COLOR"] = "1"
    child = pexpect.spawn(sys.executable, ["-m", "embodied_r.apps.cli_eval", "chat", *args, "--recipe", "smoke",
                                           "--set", "keyframes.max_frames=4", "--set", "keyframes.workers=1"],
                          env=env, cwd=str(ROOT), encoding="utf-8", timeout=TIMEOUT, dimensions=(50, 200))
    transcript = io.StringIO()
    child.logfile_read = transcript
    return child, transcript


def test_chat_on_the_tiny_models(clip: Path, tiny_lm_path: Path, tiny_vlm_path: Path, embodied_r_home: Path,
                                 tmp_path: Path) -> None:
    history = tmp_path / "history.json"
    child, transcript = _spawn([str(clip), "--model", "tiny:lm", "--save", str(history), "--max-new-tokens", "8"],
                               embodied_r_home)
    try:
        child.expect(r"(\d+) key frames\.")
        n_frames = int(child.match.group(1))
        child.expect_exact("you> ")
        child.sendline("Where is the red door?")
        child.expect_exact("Describing the video (once) ...")
        child.expect_exact("answer> ")
        child.expect_exact("you> ")
        child.sendline("/video")
        child.expect(r"Frame 0: Observe: .*\r\n")
        child.expect_exact("you> ")
        child.sendline("And what is behind me?")
        child.expect_exact("answer> ")
        child.expect_exact("you> ")
        child.sendeof()  # Ctrl-D ends the session
        child.expect_exact("History saved to")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, transcript.getvalue()
    assert transcript.getvalue().count("Describing the video (once)") == 1  # perception once
    saved = json.loads(history.read_text())
    assert n_frames == saved["key_frames"] == 4
    assert saved["focus"] == "Where is the red door?"  # the first question guided the VLM
    assert saved["video_text"].startswith("Frame 0: Observe:") and "Frame 3: After" in saved["video_text"]
    assert [t["question"] for t in saved["turns"]] == ["Where is the red door?", "And what is behind me?"]
    assert all(t["raw"] and t["error"] is None for t in saved["turns"])
    assert saved["reasoner"].endswith(tiny_lm_path.name)


@pytest.fixture()
def reasoner() -> Iterator[ScriptedModels]:
    def reply(model: str, messages: list[dict[str, Any]]) -> str:
        asked = messages[-1]["content"]
        letter = "3" if "How many chairs?" in asked else "B"
        return f"<think>Frame 2 shows the door on my left.\nSo the answer follows.</think>\n<answer>{letter}</answer>"

    server = ScriptedModels(reply)
    yield server
    server.stop()


def test_chat_shows_thinking_apart_and_keeps_history(clip: Path, tiny_vlm_path: Path, embodied_r_home: Path,
                                                     reasoner: ScriptedModels, tmp_path: Path) -> None:
    history = tmp_path / "history.json"
    child, transcript = _spawn(
        [str(clip), "--model", "reasoner", "--save", str(history), "--focus", "doors and chairs",
         "--set", "evaluation.backend.kind=openai", "--set", f"evaluation.backend.base_url={reasoner.base_url}",
         "--set", "evaluation.backend.api_key_env=EMBODIED_R_TEST_KEY"],
        embodied_r_home, color=True)
    try:
        child.expect_exact("Describing the video (once) ...")  # --focus: described before any question
        child.expect_exact("you> ")
        child.sendline("Where is the door? Options: A. right B. left")
        child.expect_exact("thinking>")
        child.expect_exact("Frame 2 shows the door on my left.")
        child.expect_exact("So the answer follows.")
        child.expect(r"answer>\S* B\r\n")
        child.expect_exact("you> ")
        child.sendline("How many chairs?")
        child.expect(r"answer>\S* 3\r\n")
        child.expect_exact("you> ")
        child.sendline("/history")
        child.expect_exact("1. Where is the door? Options: A. right B. left -> B")
        child.expect_exact("you> ")
        # Ctrl-C through the pseudo-terminal was lost now and then in the full suite (only the
        # echoed ^C came back), so leaving by Ctrl-C is tested apart, below.
        child.sendline("/quit")
        child.expect_exact("History saved to")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, transcript.getvalue()
    out = transcript.getvalue()
    assert "\x1b[2mthinking>\x1b[0m" in out  # the reasoning is dimmed apart from the answer
    saved = json.loads(history.read_text())
    assert saved["focus"] == "doors and chairs"
    turns = saved["turns"]
    assert turns[0]["thinking"] == "Frame 2 shows the door on my left.\nSo the answer follows."
    assert turns[0]["answer"] == "B" and turns[0]["formatted"] is True
    assert turns[-1]["question"] == "How many chairs?" and turns[-1]["answer"] == "3"
    # Each question carries the video text; earlier turns ride along as context.
    last = reasoner.requests[-1]["messages"]
    assert [m["role"] for m in last[:3]] == ["system", "user", "assistant"]
    assert last[1]["content"] == "Where is the door? Options: A. right B. left"
    assert saved["video_text"] in last[-1]["content"] and "How many chairs?" in last[-1]["content"]
    assert "A. right" in reasoner.requests[0]["messages"][-1]["content"]  # options read from one line
    assert all("Frame 0: Observe:" in text_of(r["messages"][-1:]) for r in reasoner.requests)


def test_show_turn_without_the_format() -> None:
    out = io.StringIO()
    show_turn(Turn("q?", thinking="", answer="just text", raw="just text", formatted=False, seconds=0.1), out)
    assert out.getvalue() == ("(the reply is not in the <think>/<answer> format: shown whole)\n"
                              "answer> just text\n")
    out = io.StringIO()
    show_turn(Turn("q?", "", "", "", False, 0.0, error="http 500"), out)
    assert "the reasoning model failed: http 500" in out.getvalue()


class _CtrlC(io.StringIO):
    """A terminal whose user presses Ctrl-C at the first prompt."""

    def readline(self, *args: Any) -> str:
        raise KeyboardInterrupt


def test_ctrl_c_at_the_prompt_saves_the_history(clip: Path, embodied_r_home: Path, tmp_path: Path) -> None:
    from embodied_r.apps.chat import ChatSession, chat_loop
    from embodied_r.config import load_recipe

    recipe = load_recipe("smoke", {"keyframes": {"max_frames": 4, "workers": 1}})
    session = ChatSession(video=clip, reasoner=recipe.evaluation.backend, perception=recipe.perception,
                          keyframes=recipe.keyframes, records_cfg=recipe.records, work=tmp_path / "work")
    out = io.StringIO()
    assert chat_loop(session, tmp_path / "history.json", stdin=_CtrlC(), out=out) == 0
    assert f"History saved to {tmp_path / 'history.json'}" in out.getvalue()
    assert json.loads((tmp_path / "history.json").read_text())["turns"] == []
