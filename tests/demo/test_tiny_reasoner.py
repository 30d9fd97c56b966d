"""The demo's reasoner: its tokenizer reads the policy's prompts as their content alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from embodied_r.backends.models import resolve_model
from embodied_r.scoring.rewards import REFERENCE_SYSTEM, REFERENCE_TEMPLATE_CHOICE
from embodied_r.training.prompts import DEFAULT_SYSTEM
from embodied_r.training.records import conversation
from embodied_r.training.records_config import RecordsConfig
from embodied_r.demo.tiny_reasoner import TAGS, fixed_parts


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    with pytest.MonkeyPatch.context() as env:
        env.setenv("EMBODIED_R_HOME", str(tmp_path_factory.mktemp("home")))
        folder = resolve_model("tiny:lm-reasoner")
    assert Path(folder, "config.json").is_file()
    return AutoTokenizer.from_pretrained(folder)


def _pieces(tok, text: str) -> list[str]:
    return [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]


def test_a_well_formed_reply_is_four_tokens_of_structure(tokenizer) -> None:
    pieces = _pieces(tokenizer, "<think>I see the red cube. So A.</think><answer>A</answer>")
    assert [p for p in pieces if p in TAGS] == list(TAGS)
    assert pieces[0] == "<think>" and pieces[-3:] == ["<answer>", "A", "</answer>"]


def test_the_prompts_fixed_texts_are_one_token_each(tokenizer) -> None:
    cfg = RecordsConfig()
    record = {"system": DEFAULT_SYSTEM,
              "prompt": cfg.template.format(preamble=cfg.video_preamble, video_text="Frame 0: Observe: a red cube",
                                            question="Which? Options:\nA. left\nB. right",
                                            instruction=cfg.choice_instruction)}
    text = tokenizer.apply_chat_template(conversation(record), tokenize=False, add_generation_prompt=True)
    pieces = _pieces(tokenizer, text)
    for fixed in (DEFAULT_SYSTEM, cfg.video_preamble, cfg.choice_instruction, *fixed_parts(cfg.template)):
        assert fixed in pieces, fixed[:40]
    # The content left: the frame line, the question and its options, the chat markers.
    assert len(pieces) < 60, len(pieces)
    reference = REFERENCE_TEMPLATE_CHOICE.format(question="Which?", think="I see it.")
    assert REFERENCE_SYSTEM in _pieces(tokenizer, REFERENCE_SYSTEM)
    assert all(part in _pieces(tokenizer, reference) for part in fixed_parts(REFERENCE_TEMPLATE_CHOICE))


def test_fixed_parts_are_the_text_between_fields() -> None:
    assert fixed_parts("Q:\n{question}\n\nR:\n{think}\n\nEnd.") == ["Q:\n", "\n\nR:\n", "\n\nEnd."]
    assert fixed_parts("{a}{b}") == []
