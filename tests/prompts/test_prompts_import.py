"""`embodied-r prompts import-official`: the original texts read by their place in the code of
a fixture checkout (same files and code shapes, invented texts), written with the commit and
file hashes; a recipe naming the file sends exactly those texts (the perception requests read
from a real local server), builds the user turn and the reference's prompt from them, and
records `official@<commit>`; each failure is one line that names what was looked for."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from embodied_r.apps.cli import main
from embodied_r.config import load_recipe
from embodied_r.errors import PromptsError, RecipeError
from embodied_r.pipeline import plan
from embodied_r.prompts.official import import_checkout
from embodied_r.prompts.store import load
from embodied_r.tracking.names import safe_params

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "official"
COMMIT = "0123456789abcdef0123456789abcdef01234567"

# The invented texts of the fixture, as the original code would have built them.
FIRST = "FIRST-TEXT: an invented opening view; mention '{qa}' if seen."
PAIR = ("PAIR-TEXT: two invented pictures, before and after 100% of a step. \n1. Name the step. \n"
        "2. Name what is new. \n3. Look for '{qa}' without answering.")
PREAMBLE = "Invented preamble: frames of a walk are written out below,     one line per frame, oldest first."
USER = "USER-TEXT invented.\nWalk log: \n[\n{video}\n]\nAsked: {qa}"
SYSTEM = "SYSTEM-TEXT: an invented system message with <think> </think> tags."
REFERENCE = "REFERENCE-TEXT invented.\n\nQ) {question}\n\nNotes) {think}\n\nOne letter:"
REFERENCE_SYSTEM = "REFERENCE-SYSTEM: an invented judge."



def checkout(tmp_path: Path, name: str = "embodied_r_code", head: str = "branch") -> Path:
    """A copy of a fixture with the .git files of a clone: HEAD on a branch (loose or packed
    ref) or detached."""
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    if head == "detached":
        (git / "HEAD").write_text(COMMIT + "\n")
    else:
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        if head == "packed":
            (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{COMMIT} refs/heads/main\n")
        else:
            (git / "refs" / "heads" / "main").write_text(COMMIT + "\n")
    return root


def imported(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> Path:
    home = tmp_path / "home"
    assert main(["--home", str(home), "prompts", "import-official", str(checkout(tmp_path)), *extra]) == 0
    path = home / "prompts" / f"embodied-r-{COMMIT[:12]}.json"
    assert str(path) in capsys.readouterr().out
    return path


@pytest.mark.parametrize("head", ["branch", "packed", "detached"])
def test_import_round_trips_the_fixture(tmp_path: Path, capsys: pytest.CaptureFixture[str], head: str) -> None:
    home = tmp_path / "home"
    root = checkout(tmp_path, head=head)
    assert main(["--home", str(home), "prompts", "import-official", str(root)]) == 0
    prompts = load(home / "prompts" / f"embodied-r-{COMMIT[:12]}.json")
    assert prompts.repository == "embodied-r" and prompts.commit == COMMIT and prompts.label == "official@0123456789ab"
    text = {k: t.text for k, t in prompts.texts.items()}
    assert text["perception.first_frame"].format(qa="Q") == FIRST.format(qa="Q")
    assert text["perception.pair"].format(qa="Q") == PAIR.format(qa="Q")
    assert text["convert.video_preamble"].format() == PREAMBLE
    assert text["convert.user_turn"].format(video_content_str="V", original_qa="Q") == USER.format(video="V", qa="Q")
    assert text["convert.question"].format(question="Q", choices="C") == "Question: Q\nPick one of these {braced}:\nC"
    assert text["convert.system"].format() == SYSTEM
    assert text["reference.template"].format(question="Q", think_content="T") == REFERENCE.format(question="Q", think="T")
    assert text["reference.system"].format() == REFERENCE_SYSTEM
    assert prompts.files == {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in (
        "dataset/data_preprocess.py", "infer/batch_inference.py", "train/conver_format/VLM_perception_API.py",
        "train/reward/consistency_reward_API.py")}


def test_import_of_the_local_scripts_and_of_embodied_reasoner(tmp_path: Path) -> None:
    local = import_checkout(checkout(tmp_path), perception="local", reference="local")
    # The continuation line keeps the source's indentation, as the original string does.
    assert local.texts["perception.pair"].text.format(qa="Q") == "LOCAL-PAIR-TEXT: invented,                     about 'Q'."
    assert local.texts["reference.system"].text == "LOCAL-REFERENCE-SYSTEM: invented."
    reasoner = import_checkout(checkout(tmp_path, "embodied_reasoner"))
    assert reasoner.repository == "embodied-reasoner" and len(reasoner.texts) == 12
    # The module constants are templates of their own (the original fills them with format).
    after = reasoner.texts["reasoner.after_action"].text.format()
    assert after.format(action="pickup Apple") == 'REASONER-AFTER: you did "pickup Apple" (invented).'
    assert reasoner.texts["reasoner.first_turn"].text.format().format(task_name="T") == (
        'REASONER-FIRST: invented task "T" with actions {\n"put <object>": invented.}')


def _one_line_error(path: Path, *extra: str, capsys: pytest.CaptureFixture[str], home: Path) -> str:
    assert main(["--home", str(home), "prompts", "import-official", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    return err


def test_each_failure_is_one_line_naming_what_and_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    assert "not found" in _one_line_error(tmp_path / "nowhere", capsys=capsys, home=home)
    (tmp_path / "empty").mkdir()
    assert "neither original repository" in _one_line_error(tmp_path / "empty", capsys=capsys, home=home)

    no_git = tmp_path / "nogit"
    shutil.copytree(FIXTURES / "embodied_r_code", no_git)
    assert "no .git/HEAD" in _one_line_error(no_git, capsys=capsys, home=home)

    moved = checkout(tmp_path / "moved")
    script = moved / "train/conver_format/VLM_perception_API.py"
    script.write_text(script.read_text().replace("def derive_video_content_str", "def describe_video"))
    err = _one_line_error(moved, capsys=capsys, home=home)
    assert "convert.video_preamble" in err and "derive_video_content_str" in err and "VLM_perception_API.py" in err

    gone = checkout(tmp_path / "gone")
    script = gone / "train/conver_format/VLM_perception_API.py"
    script.write_text(script.read_text().replace("qa_w_content =", "turn ="))
    err = _one_line_error(gone, capsys=capsys, home=home)
    assert "convert.user_turn" in err and "'qa_w_content'" in err and "not found" in err

    refilled = checkout(tmp_path / "refilled")
    script = refilled / "train/reward/consistency_reward_API.py"
    script.write_text(script.read_text().replace("{think_content}", "{reasoning}"))
    err = _one_line_error(refilled, capsys=capsys, home=home)
    assert "reference.template" in err and "think_content" in err and "reasoning" in err

    deleted = checkout(tmp_path / "deleted")
    (deleted / "infer/batch_inference.py").unlink()
    err = _one_line_error(deleted, capsys=capsys, home=home)
    assert "convert.system" in err and "infer/batch_inference.py not found" in err


def test_a_recipe_naming_a_missing_or_foreign_file_stops_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "none.json"
    with pytest.raises(RecipeError) as exc:
        load_recipe("paper", {"prompts": {"file": str(missing)}})
    assert str(missing) in str(exc.value) and "import-official" in str(exc.value) and "\n" not in str(exc.value)
    foreign = import_checkout(checkout(tmp_path, "embodied_reasoner"))
    path = tmp_path / "reasoner.json"
    path.write_text(json.dumps(foreign.model_dump(mode="json")))
    with pytest.raises(RecipeError, match="holds embodied-reasoner texts") as exc:
        load_recipe("paper", {"prompts": {"file": str(path)}})
    assert "\n" not in str(exc.value)
    with pytest.raises(PromptsError):
        load(tmp_path / "nothing.json")


def test_recipe_builds_the_user_turn_and_the_reference_prompt_from_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from embodied_r.scoring.rewards import make_consistency_reward
    from embodied_r.training.records import build_record

    path = imported(tmp_path, capsys)
    recipe = load_recipe("paper", {"prompts": {"file": str(path)}})
    row = {"uid": "u", "benchmark": "vsibench", "category": "route_planning", "split": "train",
           "question": "Which way?", "options": ["A. left", "B. right"], "answer": "B", "answer_type": "choice"}
    record = build_record(row, "Frame 0: Observe: a hall", recipe.records)
    qa = "Which way?\nPick one of these {braced}:\nA. left\nB. right"
    assert record["system"] == SYSTEM
    assert record["prompt"] == USER.format(video=PREAMBLE + "\nFrame 0: Observe: a hall", qa=qa)
    assert record["question"] == qa

    sent: list[Any] = []

    class Capture:  # the reference's side of the call: what it is asked
        def generate(self, conversations: list[Any], **_: Any) -> list[Any]:
            from embodied_r.backends.base import Generation

            sent.extend(conversations)
            return [Generation(text="B") for _ in conversations]

    reward = make_consistency_reward(Capture(), scoring=recipe.training.scoring)  # type: ignore[arg-type]
    assert reward(["<think>it is on the right</think><answer>B</answer>"], solution=["B"],
                  question=[record["question"]], answer_type=["choice"], options=[row["options"]]) == [1.0]
    # The original reward reads the question back as "Question:" and the turn's text after it.
    assert sent == [[{"role": "system", "content": REFERENCE_SYSTEM},
                     {"role": "user", "content": REFERENCE.format(question="Question:" + qa, think="it is on the right")}]]


def test_the_file_keys_the_stages_it_changes_and_the_run_records_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from embodied_r.evaluation.report import render_markdown

    path = imported(tmp_path, capsys)
    root = tmp_path / "stages"
    plain = plan(load_recipe("paper"), root)
    official = plan(load_recipe("paper", {"prompts": {"file": str(path)}}), root)
    changed = [name for name in plain if plain[name].key != official[name].key]
    assert changed[:3] == ["perception", "convert", "train_stage1"] and "keyframes" not in changed
    assert official["evaluate"].config["prompts"] == "official@0123456789ab"
    assert plain["evaluate"].config["prompts"] == "paraphrase"
    # Another text in the file is another stage key.
    data = json.loads(path.read_text())
    data["texts"]["perception.pair"]["text"] += " More."
    path.write_text(json.dumps(data))
    edited = plan(load_recipe("paper", {"prompts": {"file": str(path)}}), root)
    assert edited["perception"].key != official["perception"].key
    assert edited["keyframes"].key == official["keyframes"].key
    # A relative path is read from the home; the parent run's params carry the label.
    monkeypatch.setenv("EMBODIED_R_HOME", str(tmp_path / "home"))
    recipe = load_recipe("paper", {"prompts": {"file": f"prompts/{path.name}"}})
    params = safe_params({"recipe": recipe.model_dump(mode="json")})
    assert params["recipe.prompts.source"] == "official@0123456789ab"
    report = render_markdown([], {}, model="m", split="test", prompts=recipe.evaluation.prompts)
    assert "- prompts: `official@0123456789ab`" in report


def test_a_recipe_run_sends_the_files_texts_to_the_perceiver(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from embodied_r.perception.stage import run_perception
    from tests.perception.test_perception import make_inputs
    from tests.perception.test_perception_http import RecordingServer

    from tests.servers import StubReply, completion

    class ActingServer(RecordingServer):
        """Records every body and answers as a perceiver would, in the three points the
        official pair prompt asks for, whatever the fixture's invented text says (the stage
        refuses a perceiver that never names an action)."""

        def _answer(self, body: dict[str, Any]) -> StubReply:
            super()._answer(body)
            pair = sum(p.get("type") == "image_url" for p in body["messages"][0]["content"]) == 2
            text = "1. Rotate right.\n2. A grey corridor.\n3. The door, ahead." if pair else "A grey hall."
            return StubReply(payload=completion(body["model"], text), headers={"Retry-After": "0"})

    path = imported(tmp_path, capsys)
    server = ActingServer()
    try:
        recipe = load_recipe("paper", {"prompts": {"file": str(path)}, "perception": {"backend": {
            "kind": "openai", "model": "vlm", "base_url": server.base_url, "api_key_env": "EMBODIED_R_TEST_NO_KEY",
            "max_retries": 1, "timeout_s": 5.0, "max_pixels": 64 * 64}}})
        catalog, kf = make_inputs(tmp_path, {"a": 3}, [("q:1", "a")])
        summary = run_perception(catalog, kf, tmp_path / "out", recipe.perception)
    finally:
        server.stop()
    assert summary["done"] == 1 and summary["failed"] == 0
    qa = "Where is the landmark seen in a?\nPick one of these {braced}:\nA. left\nB. right"
    # The original form: one user message, the text first, then the frame or the pair.
    sent = sorted((len(b["messages"][0]["content"]) - 1, b["messages"][0]["content"][0]) for b in server.bodies)
    assert [len(b["messages"]) for b in server.bodies] == [1, 1, 1]
    assert sent == [(1, {"type": "text", "text": FIRST.format(qa=qa)}),
                    (2, {"type": "text", "text": PAIR.format(qa=qa)}),
                    (2, {"type": "text", "text": PAIR.format(qa=qa)})]


def test_a_reasoner_recipe_with_the_file_converses_in_the_originals_texts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from embodied_r.config import load_reasoner
    from embodied_r.pipeline import plan
    from embodied_r.interactive.episode import run_episodes
    from embodied_r.interactive.household import HouseholdEnvironment
    from tests.interactive.test_interactive_episode import TASK, scripted

    home = tmp_path / "home"
    assert main(["--home", str(home), "prompts", "import-official", str(checkout(tmp_path, "embodied_reasoner"))]) == 0
    path = home / "prompts" / f"embodied-reasoner-{COMMIT[:12]}.json"
    rec = load_reasoner("reasoner-paper", {"prompts": {"file": str(path)}})
    assert rec.prompts.source == "official@0123456789ab"
    with pytest.raises(ValueError, match="holds embodied-reasoner texts"):
        load_recipe("paper", {"prompts": {"file": str(path)}})
    replies = ["dance", "pickup Spaceship", "navigate to Fridge", "move forward", "end"]
    # The string rule: no embedding model here, and "Spaceship" must stay unmatched.
    episode = rec.evaluate.episode.model_copy(update={"matcher": "string"})
    (ep,) = run_episodes([TASK], HouseholdEnvironment, scripted(replies), tmp_path / "out", episode)
    users = [m["content"] for m in ep.messages if m["role"] == "user"]
    assert ep.messages[0] == {"role": "system", "content": "REASONER-SYSTEM: an invented robot."}
    assert users[0].endswith('REASONER-FIRST: invented task "' + TASK["taskquery"] + '" with actions {\n'
                             '"put <object>": invented.}') and users[0].startswith("<image>")
    assert users[1] == "REASONER-INVALID: invented.REASONER-ERROR: invented."
    assert users[2] == '<|feedback|>ACT-UNKNOWN "pickup" (invented).\nREASONER-ERROR: invented.'
    assert users[3].endswith('REASONER-AFTER: you did "navigate to Fridge" (invented).')
    assert users[4].endswith('REASONER-FORWARD: you did "move forward" (invented).')
    # The texts are part of the evaluation stage's key.
    plain = plan(load_reasoner("reasoner-paper"), tmp_path / "stages")
    official = plan(rec, tmp_path / "stages")
    assert plain["reasoner_evaluate"].key != official["reasoner_evaluate"].key
    # The rollouts of the exploration stage converse in the same texts.
    assert official["reasoner_explore"].config["episode"]["texts"]["source"] == "official@0123456789ab"
    assert plain["reasoner_explore"].config["episode"]["texts"] is None
    assert plain["reasoner_data"].key == official["reasoner_data"].key
