"""Perception modes: which calls each plans, the prompts and schemas they send, and
reading question passes and truncated replies."""

from __future__ import annotations

import json

import pytest

from embodied_r.perception import prompts
from embodied_r.perception.modes import PerQuestion, PerVideo, Question, make_mode, windows
from embodied_r.perception.parse import parse_frame_response, parse_question_pass

# The `improved` recipe's style: JSON replies, images before the text, a system message.
JSON_STYLE = prompts.PromptStyle("json", "images_first", True)


def questions() -> list[Question]:
    frames = {"a": [f"/kf/a/{i}.jpg" for i in range(4)], "b": [f"/kf/b/{i}.jpg" for i in range(3)]}
    spec = [("q:1", "a"), ("q:2", "b"), ("q:3", "a"), ("q:4", "a"), ("q:5", "b")]
    return [Question(uid, vid, f"Where is it? ({uid})", frames[vid]) for uid, vid in spec]


def test_windows() -> None:
    assert windows(4, 32) == [range(0, 4)]
    assert windows(7, 3) == [range(0, 3), range(3, 7)]  # no lone last frame
    assert windows(6, 3) == [range(0, 3), range(3, 6)]
    assert windows(1, 32) == [range(0, 1)]


def test_per_question_plan() -> None:
    calls = PerQuestion(JSON_STYLE).calls(questions())
    assert len(calls) == 3 * 4 + 2 * 3 and {c.kind for c in calls} == {"frame"}
    assert len({c.key for c in calls}) == len(calls)
    # Round by round, and within a round the questions of one video side by side.
    assert [c.key for c in calls[:5]] == ["q:1:0", "q:3:0", "q:4:0", "q:2:0", "q:5:0"]
    first, pair = calls[0], calls[5]
    assert first.schema == prompts.FIRST_FRAME_SCHEMA and pair.schema == prompts.PAIR_SCHEMA
    assert [p["type"] for p in pair.conversation[1]["content"]] == ["image", "image", "text"]


def test_per_question_plan_in_the_official_form() -> None:
    calls = PerQuestion().calls(questions())  # numbered replies, text first, no system message
    first, pair = calls[0], calls[5]
    assert first.schema is None and pair.schema is None
    assert [m["role"] for m in pair.conversation] == ["user"]
    assert [p["type"] for p in pair.conversation[0]["content"]] == ["text", "image", "image"]
    assert [p["path"] for p in pair.conversation[0]["content"][1:]] == ["/kf/a/0.jpg", "/kf/a/1.jpg"]
    text = pair.conversation[0]["content"][0]["text"]
    assert "three numbered points" in text and text.endswith("Question: Where is it? (q:1)")


def test_per_video_plan_shares_video_calls() -> None:
    qs = questions()
    calls = PerVideo(question_window=32, style=JSON_STYLE).calls(qs)
    kinds = [c.kind for c in calls]
    # 4 + 3 video calls and one question pass per question, video calls first.
    assert kinds == ["scene"] * 2 + ["pair"] * 5 + ["question"] * 5
    assert {c.key for c in calls if c.kind != "question"} == {
        f"video:{v}:{f}" for v, n in (("a", 4), ("b", 3)) for f in range(n)
    }
    scene = calls[0].conversation[1]["content"]
    assert [p["type"] for p in scene] == ["image", "text"] and "Question" not in scene[1]["text"]
    assert calls[0].schema == prompts.SCENE_SCHEMA
    pair = next(c for c in calls if c.key == "video:a:2")
    assert [p["path"] for p in pair.conversation[1]["content"][:2]] == ["/kf/a/1.jpg", "/kf/a/2.jpg"]
    assert pair.schema["properties"]["action"]["enum"] == list(prompts.ACTIONS)

    passes = [c for c in calls if c.kind == "question"]
    assert [c.key for c in passes] == [f"question:q:{i}:0" for i in (1, 3, 4, 2, 5)]
    a1, a3 = passes[0].conversation[1]["content"], passes[1].conversation[1]["content"]
    # All key frames first, then the instruction, then the question: the questions of a
    # video share everything before their own text.
    assert [p.get("path") for p in a1[:-1]] == qs[0].frames and a1[-1]["type"] == "text"
    assert a1[:-1] == a3[:-1]
    assert a1[-1]["text"].endswith("Question: Where is it? (q:1)")
    common = a1[-1]["text"].split("Question:")[0]
    assert common == a3[-1]["text"].split("Question:")[0] and '"frame_3"' in common
    assert passes[0].schema["required"] == ["frame_0", "frame_1", "frame_2", "frame_3"]


def test_per_video_windows_and_keys() -> None:
    long = [Question("q:1", "v", "Q", [f"/f/{i}.jpg" for i in range(7)])]
    passes = [c for c in PerVideo(question_window=3, style=JSON_STYLE).calls(long) if c.kind == "question"]
    assert [c.key for c in passes] == ["question:q:1:0", "question:q:1:3"]
    second = passes[1].conversation[1]["content"]
    assert [p["path"] for p in second[:-1]] == [f"/f/{i}.jpg" for i in range(3, 7)]
    assert "key frames 3 to 6" in second[-1]["text"]
    assert passes[1].schema["required"] == ["frame_3", "frame_4", "frame_5", "frame_6"]
    with pytest.raises(ValueError, match="per_question or per_video"):
        make_mode("per_frame", 3)  # type: ignore[arg-type]


def test_per_video_assembly() -> None:
    q = Question("q:1", "v", "Q", ["/f/0.jpg", "/f/1.jpg", "/f/2.jpg"])
    mode = PerVideo(question_window=32, style=JSON_STYLE)
    done = {
        "video:v:0": {"raw": '{"new_info": "a hall"}'},
        "video:v:1": {"raw": '{"action": "turn left", "new_info": "a door"}'},
        "video:v:2": {"raw": "Action: move forward\nNew information: stairs"},
    }
    assert mode.assemble(q, done) == "question:q:1:0"  # still missing
    done["question:q:1:0"] = {"raw": json.dumps({"frame_0": "none", "frame_2": "the sofa, left"})}
    built = mode.assemble(q, done)
    assert [(i.action, i.new_info, i.question_info) for i in built.infos] == [
        ("", "a hall", "none"),
        ("rotate left", "a door", ""),
        ("move forward", "stairs", "the sofa, left"),
    ]
    assert built.keys == ["video:v:0", "video:v:1", "video:v:2", "question:q:1:0"]


def test_per_video_in_numbered_form() -> None:
    q = Question("q:1", "v", "Q", ["/f/0.jpg", "/f/1.jpg", "/f/2.jpg"])
    mode = PerVideo(question_window=32)
    calls = mode.calls([q])
    assert all(c.schema is None for c in calls)
    assert "two numbered points" in calls[1].conversation[0]["content"][0]["text"]
    assert 'one line per frame: "Frame <number>' in calls[-1].conversation[0]["content"][0]["text"]
    done = {
        "video:v:0": {"raw": "A grey hall with a red door ahead."},
        "video:v:1": {"raw": "1. Rotate left.\n2. A white door to the front-left."},
        "video:v:2": {"raw": "1. **Action:** move upward\n2. **New information:** stairs below"},
        "question:q:1:0": {"raw": "Frame 0: none\nFrame 2: the sofa, to the left"},
    }
    built = mode.assemble(q, done)
    assert [(i.action, i.new_info, i.question_info) for i in built.infos] == [
        ("", "A grey hall with a red door ahead.", "none"),
        ("rotate left", "A white door to the front-left.", ""),
        ("move up", "stairs below", "the sofa, to the left"),
    ]


@pytest.mark.parametrize(
    ("text", "expected", "how"),
    [
        ('{"frame_0": "a", "frame_1": "b"}', {0: "a", 1: "b"}, "json"),
        ('Sure:\n```json\n{"Frame 0": "x", "1": ["y", "z"], "frame_9": "out"}\n```', {0: "x", 1: "y; z"}, "json"),
        ('{"frames": ["p", "q"]}', {0: "p", 1: "q"}, "json"),
        ("Frame 0: none\n**Frame 1:** the gate\n  straight ahead", {0: "none", 1: "the gate straight ahead"}, "labels"),
        ('{"frame_0": "the tower is on the le', {0: "the tower is on the le"}, "partial_json"),
        ("the tower stays on the left", {0: "the tower stays on the left"}, "text"),
        ("", {}, "text"),
    ],
)
def test_parse_question_pass(text: str, expected: dict[int, str], how: str) -> None:
    assert parse_question_pass(text, range(0, 2)) == (expected, how)


def test_truncated_json_keeps_what_was_written() -> None:
    info = parse_frame_response('{"action": "rotate_left", "new_info": "a bridge \\"far\\" ah', first=False)
    assert (info.action, info.new_info, info.parsed_as) == ("rotate left", 'a bridge "far" ah', "partial_json")


def test_schemas_are_strict_objects() -> None:
    for schema in (prompts.FIRST_FRAME_SCHEMA, prompts.PAIR_SCHEMA, prompts.SCENE_SCHEMA,
                   prompts.VIDEO_PAIR_SCHEMA, prompts.question_pass_schema(range(2, 5))):
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert schema["required"] == list(schema["properties"])
        json.dumps(schema)
    assert prompts.PAIR_SCHEMA["properties"]["action"]["enum"] == list(prompts.ACTIONS)
