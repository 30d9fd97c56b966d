"""docs/fidelity.md and the code cannot drift apart: every value the table gives for the
`paper`, `official-script` and `improved` recipes is checked against what the code builds
from those recipes (the perception request, the reasoner prompt, GRPOConfig's arguments,
the Table 1 figure). The perception prompts are checked for every point of the official
pair prompt."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np
import pytest
import yaml

from embodied_r.backends.images import load_image
from embodied_r.config import Recipe, load_recipe
from embodied_r.evaluation.report import COLUMN_NAMES, run_row
from embodied_r.perception import prompts
from embodied_r.perception.modes import Question
from embodied_r.perception.parse import FrameInfo
from embodied_r.scoring.metrics import aggregate
from embodied_r.training.grpo import grpo_kwargs, reward_setup
from embodied_r.training.records import build_record

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "fidelity.md"
RECIPES = ("paper", "official-script", "improved")
COLUMNS = ("setting", "paper", "official code", "`paper` recipe", "`official-script`", "`improved`", "why")
DEMO_COLUMNS = ("setting", "paper", "`demo`", "why")


# -- the table ----------------------------------------------------------------------------


def tables() -> list[list[list[str]]]:
    """Every table of docs/fidelity.md, in order: its rows of cells, the head first."""
    found: list[list[list[str]]] = []
    previous = ""
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                found.append([])
            found[-1].append([c.strip() for c in line.strip().strip("|").split("|")])
        previous = line
    return found


def table(which: int = 0, columns: tuple[str, ...] = COLUMNS) -> list[dict[str, str]]:
    """The rows of a table of docs/fidelity.md (the first: the paper's recipes), as {column: cell}."""
    cells = tables()[which]
    head, rows = cells[0], cells[2:]
    assert tuple(head) == columns, f"docs/fidelity.md's table {which + 1} must have the columns {columns}, has {head}"
    assert all(len(r) == len(head) for r in rows), "a row of docs/fidelity.md has the wrong number of cells"
    return [dict(zip(head, r)) for r in rows]


def key_of(row: dict[str, str]) -> str:
    match = re.match(r"`([^`]+)`", row["setting"])
    assert match, f"the setting cell {row['setting']!r} must start with its key in backticks"
    return match.group(1)


def cell_value(cell: str) -> str:
    match = re.match(r"`([^`]*)`", cell)
    assert match, f"a recipe cell must start with its value in backticks, got {cell!r}"
    return match.group(1)


def same(cell: str, actual: Any) -> bool:
    """A cell's text against a value: read as YAML for numbers, booleans and null, as text
    for strings."""
    if isinstance(actual, str):
        return cell == actual or (actual == "" and cell == '""')
    parsed = yaml.safe_load(cell) if cell else None
    if isinstance(actual, bool) or actual is None:
        return parsed is actual
    if isinstance(actual, (int, float)):
        return isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and math.isclose(parsed, actual)
    return cell == str(actual)


# -- what the code builds from a recipe ---------------------------------------------------


def jpeg_720p(folder: Path) -> str:
    path = folder / "frame.jpg"
    if not path.exists():
        image = np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8)
        cv2.imwrite(str(path), image, [cv2.IMWRITE_JPEG_QUALITY, 95])
    return str(path)


def perception_request(recipe: Recipe, frame: str) -> dict[str, Any]:
    """The call about a pair of frames that the perception stage would send."""
    cfg = recipe.perception
    q = Question("q1", "v1", "Where is the red tower?\nA. left\nB. right", [frame, frame])
    calls = cfg.plan().calls([q])
    pair = next(c for c in calls if c.kind in ("frame", "pair") and len(
        [p for p in c.conversation[-1]["content"] if p["type"] == "image"]) == 2)
    content = pair.conversation[-1]["content"]
    width, height = load_image(frame, cfg.backend.max_pixels).size
    return {
        "request.content_order": ", ".join(p["type"] for p in content),
        "request.system_message": pair.conversation[0]["role"] == "system",
        "request.schema": "json" if (pair.schema is not None and cfg.structured_output) else "none",
        "request.max_tokens": cfg.max_new_tokens,
        "request.image_720p": f"{width}x{height}",
        "request.text": next(p["text"] for p in content if p["type"] == "text"),
    }


def reasoner_prompt(recipe: Recipe) -> dict[str, Any]:
    infos = [FrameInfo("", "a street", "the tower ahead", "numbered"),
             FrameInfo("move forward", "a bridge", "the tower to the left", "numbered")]
    video_text = recipe.perception.video_text(infos)
    row = {"uid": "u", "benchmark": "urbanvideo", "category": "Landmark Position", "split": "train",
           "question": "Where is the tower?", "options": ["A. left", "B. right"], "answer": "A",
           "answer_type": "choice"}
    record = build_record(row, video_text, recipe.records)
    return {
        "reasoner.system_tail": record["system"].endswith("User: . Assistant:"),
        "reasoner.user_turn_ends_with": "question" if record["prompt"].endswith(record["question"]) else "instruction",
        "reasoner.question_label": "Question-related:" in record["prompt"],
    }


def grpo(recipe: Recipe) -> dict[str, Any]:
    cfg = recipe.training
    stage = cfg.stages[0]
    funcs, weights = reward_setup(stage, cfg)
    kwargs = grpo_kwargs(stage, cfg, Path("/tmp/unused"), weights, [])
    out = {f"grpo.{k}": v for k, v in kwargs.items()}
    out.setdefault("grpo.vllm_max_model_length", None)
    out.setdefault("grpo.epsilon_high", None)
    out["schedule"] = " → ".join(
        ":".join(f"{s.rewards.get(n, 0):g}" for n in ("format", "accuracy", "consistency")) + f"@{s.epochs:g}"
        for s in cfg.stages)
    return out


def table1_rdir() -> str:
    """How the Table 1 comparison counts relative direction: pooled or subtype mean."""
    rows = [{"benchmark": "vsibench", "category": "object_rel_direction", "subtask": s, "score": v}
            for s, v in (("easy", 1.0), ("easy", 1.0), ("easy", 1.0), ("hard", 0.0))]
    rdir = run_row(aggregate(rows))[COLUMN_NAMES.index("RDir")]
    return {0.75: "pooled", 0.5: "subtype mean"}[rdir]


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flat(v, f"{prefix}{k}."))
    else:
        out[prefix.rstrip(".")] = data
    return out


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    frame = jpeg_720p(tmp_path_factory.mktemp("frames"))
    out = {}
    for name in (*RECIPES, "demo"):
        recipe = load_recipe(name)
        values = flat(recipe.model_dump(mode="json"))
        values.update(perception_request(recipe, frame))
        values.update(reasoner_prompt(recipe))
        values.update(grpo(recipe))
        values["report.table1_rdir"] = table1_rdir()
        out[name] = values
    return out


# -- the checks ---------------------------------------------------------------------------


def test_the_table_is_linked_from_the_readme() -> None:
    assert "docs/fidelity.md" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_recipe_value_in_the_table_is_what_the_code_builds(resolved: dict[str, dict[str, Any]]) -> None:
    rows = table()
    assert len(rows) >= 30
    keys = [key_of(r) for r in rows]
    assert len(set(keys)) == len(keys), "a setting appears twice in docs/fidelity.md"
    wrong = []
    for row, key in zip(rows, keys):
        assert row["why"], f"{key}: say why"
        for recipe, column in zip(RECIPES, ("`paper` recipe", "`official-script`", "`improved`")):
            assert key in resolved[recipe], f"docs/fidelity.md names {key!r}, which the code does not build"
            cell, actual = cell_value(row[column]), resolved[recipe][key]
            if not same(cell, actual):
                wrong.append(f"{key} [{recipe}]: table says {cell!r}, code gives {actual!r}")
    assert not wrong, "docs/fidelity.md and the code disagree:\n" + "\n".join(wrong)


def test_the_table_covers_every_setting_that_changes_results() -> None:
    keys = {key_of(r) for r in table()}
    must = {
        "keyframes.mode", "keyframes.jpeg_max_side", "keyframes.jpeg_quality", "perception.backend.max_pixels",
        "request.image_720p", "perception.mode", "perception.reply_format", "request.content_order",
        "request.system_message", "request.schema", "request.max_tokens", "reasoner.user_turn_ends_with",
        "reasoner.question_label", "reasoner.system_tail", "schedule", "grpo.loss_type", "grpo.scale_rewards",
        "grpo.lr_scheduler_type", "grpo.weight_decay", "grpo.warmup_steps", "grpo.temperature", "grpo.top_p",
        "grpo.top_k", "grpo.vllm_importance_sampling_correction", "grpo.beta", "grpo.epsilon",
        "grpo.adam_beta1", "grpo.adam_beta2", "training.max_prompt_length", "grpo.max_completion_length",
        "grpo.num_generations", "grpo.learning_rate", "training.scoring.answer_parser",
        "training.scoring.format_rule", "training.scoring.consistency_when_reference_down",
        "evaluation.answer_parser", "report.table1_rdir", "perception.backend.repetition_penalty",
        "perception.backend.top_k", "training.reference.repetition_penalty", "training.reference.top_k",
        "evaluation.backend.repetition_penalty", "evaluation.backend.top_k", "prompts.source",
        "perception.on_failure", "catalog.split.rule", "grpo.vllm_max_model_length",
    }
    assert must <= keys, f"docs/fidelity.md lacks {sorted(must - keys)}"


def test_the_demo_s_departures_from_the_paper_are_what_the_demo_recipe_sets(resolved: dict[str, dict[str, Any]]) -> None:
    """The second table: where `make demo` departs from the paper, each value as the demo
    recipe gives it and the `paper` recipe's value beside it, not the same."""
    rows = table(1, DEMO_COLUMNS)
    keys = [key_of(r) for r in rows]
    assert len(set(keys)) == len(keys), "a setting appears twice in the demo's table"
    wrong = []
    for row, key in zip(rows, keys):
        assert row["why"], f"{key}: say why the demo departs"
        assert key in resolved["demo"], f"the demo's table names {key!r}, which the code does not build"
        cell, actual = cell_value(row["`demo`"]), resolved["demo"][key]
        if not same(cell, actual):
            wrong.append(f"{key}: table says {cell!r}, the demo recipe gives {actual!r}")
        if resolved["paper"].get(key, "unset") == actual:
            wrong.append(f"{key}: the demo keeps the paper's {actual!r}; it is no departure")
    assert not wrong, "docs/fidelity.md's demo table and the demo recipe disagree:\n" + "\n".join(wrong)
    must = {"perception.backend.kind", "training.policy", "warmstart.epochs", "training.max_prompt_length",
            "grpo.learning_rate", "grpo.num_generations", "grpo.max_completion_length",
            "schedule", "training.reference.model", "download.synthetic.option_order"}
    assert must <= set(keys), f"the demo's table lacks {sorted(must - set(keys))}"


# -- the perception prompts carry every point of the official pair prompt ------------------

# Each point of the official pair prompt, as concepts: every alternative group must match.
PAIR_POINTS: dict[str, list[str]] = {
    "the action, one of a fixed list of ten": [re.escape(", ".join(prompts.ACTIONS)), r"exactly one"],
    "judged from how the objects moved in view": [r"shifted in view"],
    "newly visible or previously unclear objects": [r"hidden|out of view", r"unclear"],
    "colour and shape": [r"colour", r"shape"],
    "objects of one kind repeat, such as buildings": [r"repeat", r"buildings"],
    "imagine the 3D scene around the agent": [r"three-dimensional space around the agent|3D"],
    "egocentric positions, not positions in the image": [r"front-left", r"relative to the agent",
                                                          r"not where it appears in the picture"],
    "the objects the question (and its options) names": [r"question below or its options name"],
    "do not answer, do not pick an option": [r"Do not answer the question", r"do not choose an option"],
    "be concise": [r"short and clear"],
}
FIRST_POINTS = {k: v for k, v in PAIR_POINTS.items()
                if k in ("colour and shape", "imagine the 3D scene around the agent",
                         "egocentric positions, not positions in the image",
                         "the objects the question (and its options) names", "do not answer, do not pick an option",
                         "be concise")}


def _missing(text: str, points: dict[str, list[str]]) -> list[str]:
    return [name for name, patterns in points.items() if not all(re.search(p, text) for p in patterns)]


@pytest.mark.parametrize("fmt", ["numbered", "json"])
def test_the_pair_prompt_asks_for_every_official_point(fmt: str) -> None:
    text = prompts.pair_conversation("/a.jpg", "/b.jpg", "Where is the tower?\nA. left", prompts.PromptStyle(fmt))
    instruction = next(p["text"] for p in text[-1]["content"] if p["type"] == "text")
    assert not _missing(instruction, PAIR_POINTS)
    assert instruction.endswith("Question: Where is the tower?\nA. left")
    if fmt == "numbered":
        assert re.search(r"^1\. Action:.*\n2\. New information:.*\n3\. Question objects:", instruction, re.M | re.S)
        assert "JSON" not in instruction
    else:
        assert "Reply with a JSON object only" in instruction


@pytest.mark.parametrize("fmt", ["numbered", "json"])
def test_the_first_frame_prompt_asks_for_every_official_point(fmt: str) -> None:
    conv = prompts.first_frame_conversation("/a.jpg", "Where is the tower?", prompts.PromptStyle(fmt))
    instruction = next(p["text"] for p in conv[-1]["content"] if p["type"] == "text")
    assert not _missing(instruction, FIRST_POINTS)
    assert "Describe the scene" in instruction


@pytest.mark.parametrize("fmt", ["numbered", "json"])
def test_per_video_prompts_together_ask_for_every_official_point(fmt: str) -> None:
    style = prompts.PromptStyle(fmt)
    pair = prompts.video_pair_conversation("/a.jpg", "/b.jpg", style)
    question = prompts.question_pass_conversation(["/a.jpg", "/b.jpg"], 0, "Where is the tower?", style)
    texts = [next(p["text"] for p in c[-1]["content"] if p["type"] == "text") for c in (pair, question)]
    assert not _missing("\n".join(texts), PAIR_POINTS)
    # The shared pass never sees a question; the question pass never asks for the action.
    assert "Question:" not in texts[0] and "rotate left" not in texts[1]


def test_paper_request_is_the_official_form(resolved: dict[str, dict[str, Any]]) -> None:
    paper = resolved["paper"]
    assert paper["request.content_order"] == "text, image, image"
    assert paper["request.image_720p"] == "1280x720"
    assert not _missing(paper["request.text"], PAIR_POINTS)
    improved = resolved["improved"]
    assert improved["request.content_order"] == "image, image, text" and improved["request.schema"] == "json"


def test_grpo_arguments_exist_in_the_installed_trl() -> None:
    """Every argument built for the three recipes is a field of GRPOConfig (TRL 1.16 with
    transformers 5.23 here; the same names exist under the training environment's 5.17)."""
    import dataclasses

    from trl import GRPOConfig

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    for name in RECIPES:
        cfg = load_recipe(name).training
        _, weights = reward_setup(cfg.stages[0], cfg)
        unknown = set(grpo_kwargs(cfg.stages[0], cfg, Path("/tmp/unused"), weights, [])) - fields
        # activation_checkpointing is the training-env check's business (infra/training/check-env.sh).
        assert unknown <= {"activation_checkpointing"}, f"{name}: unknown GRPOConfig arguments {unknown}"


def test_the_settings_reach_mlflow_as_params(tmp_path: Path) -> None:
    """A stage's MLflow run logs its config as params: every typed setting and named option."""
    from embodied_r.pipeline import plan
    from embodied_r.tracking.names import safe_params

    stages = plan(load_recipe("paper"), tmp_path)
    train = safe_params(stages["train_stage1"].config)
    for name in ("loss_type", "scale_rewards", "lr_scheduler_type", "weight_decay", "warmup_ratio", "top_p",
                 "top_k", "vllm_importance_sampling_correction", "max_prompt_length", "adam_beta2", "epsilon",
                 "scoring.answer_parser", "scoring.consistency_when_reference_down"):
        assert f"training.{name}" in train, name
    assert train["training.loss_type"] == "grpo" and train["training.scoring.answer_parser"] == "official"
    perception = safe_params(stages["perception"].config)
    assert perception["reply_format"] == "numbered" and perception["image_order"] == "text_first"
    assert safe_params(stages["keyframes"].config)["mode"] == "official"
    for section in ("backend.repetition_penalty", "backend.top_k"):
        assert perception[section] == "generation_config"
        assert safe_params(stages["evaluate"].config)[section] == "generation_config"
    assert train["training.reference.repetition_penalty"] == "generation_config"
    assert safe_params(stages["evaluate"].config)["answer_parser"] == "official"
