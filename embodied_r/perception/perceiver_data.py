"""What the demo's perceiver is shown and what it should answer, and how its replies score.

The synthetic world renders key-frame clips with their truth (``synthetic.views``): the
objects whose centre is in view and the camera motion between two key frames. Each clip
becomes the calls the per-question stage would make (frame 0 alone, then each pair), with
the reply a perfect perceiver gives, written by ``parse.frame_reply`` in the stage's default
reply form so that the stage reads it back as it was taught. The calls are encoded once
through the backend's own preparation; training (``perceiver``) only stacks tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np

from embodied_r.backends.base import Conversation
from embodied_r.keyframes.extract import KeyframeConfig, OverlapRule, final_selection
from embodied_r.perception import prompts
from embodied_r.perception.parse import FrameInfo, frame_reply, normalize_action, parse_frame_response
from embodied_r.synthetic.urban import URBAN_THINGS
from embodied_r.synthetic.views import KINDS, ROOM_NAMES, URBAN_NAMES, Clip, make_clips
from embodied_r.synthetic.vsi import VSI_THINGS

NOTHING = "no objects in view"
NO_QUESTION_OBJECTS = "none"
# Every object a world can hold, and what each looks like: a room's cabinet is a purple cube
# like a flight's, so the image alone tells looks apart and the question's setting the names.
NAMES = URBAN_NAMES + ROOM_NAMES
LOOKS = tuple(dict.fromkeys([*(f"{c} {s}" for c, s in URBAN_THINGS), *(f"{c} {s}" for _, c, s, _ in VSI_THINGS)]))
_LOOK = {**{f"{c} {s}": f"{c} {s}" for c, s in URBAN_THINGS}, **{n: f"{c} {s}" for n, c, s, _ in VSI_THINGS}}
# Seeds of the clips it learns from, and of the held-out clips that measure it; the demo's
# benchmark draws from other random streams altogether (``synthetic.urban`` / ``vsi``).
TRAIN_SEED = 100_000
HELD_OUT_SEED = 900_000
# The reply form it is taught: the stage's default prompt style (``prompts.PAPER_STYLE``),
# which its conversations are built in.
REPLY_FORMAT = prompts.PAPER_STYLE.reply_format

Item = tuple[Conversation, FrameInfo, bool]  # a call, its true reply, whether it is frame 0


# -- what the perceiver is shown and what it should answer -------------------------------


def _question(rng: np.random.Generator, clip: Clip) -> str:
    """A question in the benchmarks' shapes naming a few of the world's objects (and, as the
    real questions do, sometimes one that is not in view at all)."""
    pool = list(URBAN_NAMES if clip.kind == "urban" else ROOM_NAMES)
    a, b, c, d = (pool[i] for i in rng.permutation(len(pool))[:4])
    if clip.kind == "urban":
        shapes = [
            (f"At the initial position, you are asked to navigate to the {a}. When you reach the current "
             "location, what is the direction to the destination?",
             [f"The {a} is {s}." for s in ("ahead of me", "on my left", "on my right", "behind me")]),
            ("Which of the following objects do you see during the flight?",
             [f"A {n}." for n in (a, b, c, d)]),
            (f"Instead of turning left toward the {a}, if you choose to turn right, can you still face the "
             f"{a}, and how is the alternative route?", ["Longer.", "Shorter.", "Never."]),
        ]
    else:
        shapes = [
            (f"If I am standing by the {a} and facing the {b}, is the {c} to the left or the right of the "
             f"{b}?", ["left", "right"]),
            (f"Measuring from the closest point of each object, which of these objects ({b}, {c}, {d}) is "
             f"the closest to the {a}?", [b, c, d]),
            (f"What will be the first-time appearance order of the following categories in the video: "
             f"{a}, {b}, {c}, {d}?", [f"{a}, {b}, {c}, {d}", f"{d}, {c}, {b}, {a}"]),
        ]
    text, options = shapes[int(rng.integers(len(shapes)))]
    lines = [f"{'ABCD'[i]}. {o}" for i, o in enumerate(options)]
    return prompts.question_with_options(text, lines)


def truth(visible: list[str], motion: str | None, question: str, first: bool) -> FrameInfo:
    """What a perfect perceiver reports for one frame (and the motion into it)."""
    named = [n for n in visible if n in question.lower()]
    return FrameInfo(
        action="" if first else normalize_action(motion or ""),
        new_info=", ".join(visible) or NOTHING,
        question_info=", ".join(named) or NO_QUESTION_OBJECTS,
        parsed_as="json",
    )


def _save_frame(image: np.ndarray, side: int, path: Path) -> str:
    # As the key-frame stage saves them: scaled to the longest side, then JPEG at quality 90.
    h, w = image.shape[:2]
    s = side / max(h, w)
    small = cv2.resize(image, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
    cv2.imwrite(str(path), small, [cv2.IMWRITE_JPEG_QUALITY, 90])
    return str(path)


def clip_items(clip: Clip, folder: Path, tag: str, side: int, rng: np.random.Generator
               ) -> list[Item]:
    """Every call the per-question stage would make for this clip and one question: frame 0
    alone, then each pair. Pairs without a nameable motion are left out."""
    question = _question(rng, clip)
    paths = [_save_frame(f, side, folder / f"{tag}_{i}.jpg") for i, f in enumerate(clip.frames)]
    items = [(prompts.first_frame_conversation(paths[0], question),
              truth(clip.visible[0], None, question, True), True)]
    for i in range(1, len(paths)):
        if clip.motions[i - 1] is None:
            continue
        items.append((prompts.pair_conversation(paths[i - 1], paths[i], question),
                      truth(clip.visible[i], clip.motions[i - 1], question, False), False))
    return items


def stage_keyframes(cfg: KeyframeConfig) -> Callable[[list[np.ndarray]], list[int]]:
    """The key-frame stage's choice among a clip's sampled views (its overlap rule, its fill
    up to ``min_frames``, its even thinning to ``max_frames``), so that the perceiver learns
    from and is measured on the frame pairs the stage hands it at run time."""

    def keep(frames: list[np.ndarray]) -> list[int]:
        rule = OverlapRule(cfg)
        kept = []
        for i, frame in enumerate(frames):
            reason, overlap = rule.consider(frame, i == len(frames) - 1)
            if reason is not None:
                kept.append((i, overlap, reason))
        return [i for i, *_ in final_selection(kept, len(frames), cfg)]

    return keep


def sample_clips(seed: int, kind: str, chains: int, keyframes: KeyframeConfig) -> list[Clip]:
    return make_clips(seed, kind, chains, sample_fps=keyframes.sample_fps, keep=stage_keyframes(keyframes))


def make_items(seed: int, worlds: int, chains: int, folder: Path, side: int, keyframes: KeyframeConfig
               ) -> list[Item]:
    items = []
    rng = np.random.default_rng(seed)
    for w in range(worlds):
        kind = KINDS[w % len(KINDS)]
        # One world, several key-frame sequences: the panorama is the costly part.
        for c, clip in enumerate(sample_clips(seed + w, kind, chains, keyframes)):
            items += clip_items(clip, folder, f"w{w}c{c}", side, rng)
    return items


def encode_items(backend: Any, items: list[Item]) -> list[dict[str, Any]]:
    """Each call's prompt prepared and encoded exactly as the backend does it, followed by
    its reply; done once, so the training steps only stack tensors."""
    from embodied_r.backends.tiny_models import IM_END

    encoded = []
    for conversation, info, first in items:
        text, images = backend._prepare(conversation)
        reply = frame_reply(info, first, REPLY_FORMAT) + IM_END
        enc = backend._encode([(text + reply, images)])
        reply_ids = backend.tokenizer(reply, add_special_tokens=False)["input_ids"]
        ids = enc["input_ids"][0]
        # The loss is taken on the reply's tokens: they must be the prompt's very last ones.
        if ids[-len(reply_ids):].tolist() != reply_ids:
            raise ValueError("the reply does not tokenize the same after its prompt")
        encoded.append({"input_ids": ids, "mm_token_type_ids": enc["mm_token_type_ids"][0],
                        "pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"],
                        "reply": len(reply_ids)})
    return encoded


def collate(encoded: list[dict[str, Any]], pad_id: int) -> tuple[dict[str, Any], int, Any]:
    """A left-padded batch as the backend's processor pads one, and the reply targets: each
    reply ends its row, so the logits of the last ``keep`` positions cover every reply and
    the language-model head skips the long prompts."""
    import torch

    width = max(len(e["input_ids"]) for e in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    kinds = torch.zeros_like(ids)
    for row, e in enumerate(encoded):
        n = len(e["input_ids"])
        ids[row, width - n:] = e["input_ids"]
        mask[row, width - n:] = 1
        kinds[row, width - n:] = e["mm_token_type_ids"]
    batch = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": kinds,
             "pixel_values": torch.cat([e["pixel_values"] for e in encoded]),
             "image_grid_thw": torch.cat([e["image_grid_thw"] for e in encoded])}
    keep = max(e["reply"] for e in encoded) + 1
    targets = ids[:, -keep + 1:].clone()
    for row, e in enumerate(encoded):
        targets[row, : keep - 1 - e["reply"]] = -100
    return batch, keep, targets


def sampling_weights(items: list[Item], balance: float) -> np.ndarray:
    """How often each call is drawn: frame pairs by the inverse frequency of their action
    raised to ``balance`` (rotations are most of the pairs), first frames as they come."""
    counts: dict[str, int] = {}
    for _, info, first in items:
        if not first:
            counts[info.action] = counts.get(info.action, 0) + 1
    pairs = sum(counts.values())
    w = np.array([1.0 if first else (pairs / len(counts) / counts[info.action]) ** balance
                  for _, info, first in items])
    # Pairs keep their share of the draws; only their mix of actions changes.
    is_pair = np.array([not first for _, _, first in items])
    if is_pair.any():
        w[is_pair] *= is_pair.sum() / w[is_pair].sum()
    return w / w.sum()


def looks_in_view(items: list[Item]) -> np.ndarray:
    """Per call, which of ``LOOKS`` its last image shows (1) or not (0): the target of the
    vision tower's own objective, read from the true reply."""
    target = np.zeros((len(items), len(LOOKS)), np.float32)
    for row, (_, info, _) in enumerate(items):
        for name in info.new_info.split(", "):
            if name in _LOOK:
                target[row, LOOKS.index(_LOOK[name])] = 1.0
    return target


# -- scoring ---------------------------------------------------------------------------------


def _named(text: str, names: tuple[str, ...]) -> set[str]:
    text = text.lower()
    return {n for n in names if n in text}


def score_replies(truths: list[tuple[FrameInfo, bool]], replies: list[str],
                  settings: list[str] | None = None) -> dict[str, Any]:
    """Replies read by the stage's parser against the truth of their calls (see ``measure``).
    With ``settings`` (each call's world kind), also the action accuracy per setting and
    what a perceiver that reads no image could score: always naming the commonest action
    (``action_guess``), or the commonest one of each setting (``action_guess_by_setting``)."""
    from embodied_r.perception.parse import parse_frame_response

    actions_right = pairs = hits = in_view = named_total = 0
    actions: dict[str, list[tuple[str, str]]] = {}  # setting -> (true, named) action of each pair
    for i, ((want, first), text) in enumerate(zip(truths, replies)):
        got = parse_frame_response(text, first, REPLY_FORMAT)
        if not first:
            pairs += 1
            actions_right += got.action == want.action
            if settings is not None:
                actions.setdefault(settings[i], []).append((want.action, got.action))
        truth_set = set() if want.new_info == NOTHING else set(want.new_info.split(", "))
        named = _named(got.new_info, NAMES)
        hits += len(truth_set & named)
        in_view += len(truth_set)
        named_total += len(named)
    scores: dict[str, Any] = {"frames": len(truths), "pairs": pairs,
                              "action_accuracy": actions_right / pairs if pairs else 0.0,
                              "object_recall": hits / in_view if in_view else 1.0,
                              "object_precision": hits / named_total if named_total else 0.0}
    if settings is not None and pairs:
        def commonest(wanted: list[str]) -> int:
            return max(wanted.count(a) for a in set(wanted))

        scores["actions_by_setting"] = {k: sum(w == g for w, g in v) / len(v) for k, v in sorted(actions.items())}
        scores["action_guess"] = commonest([w for v in actions.values() for w, _ in v]) / pairs
        scores["action_guess_by_setting"] = sum(commonest([w for w, _ in v]) for v in actions.values()) / pairs
    return scores
