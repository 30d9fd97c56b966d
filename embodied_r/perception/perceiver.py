"""The demo's perceiver: the tiny Qwen2.5-VL taught to perceive the synthetic worlds.

A random tiny VLM makes the perception text noise. This one is trained once, on key-frame
clips the synthetic world renders with its own truth (``synthetic.views``), to name the
camera's action between two key frames and the objects in view. It is taught through the
very prompts the stage sends (``prompts``) and the backend's own input preparation, and its
target replies are written by ``parse.frame_reply``, so the stage reads them back as they
were taught. The training seeds are disjoint from the benchmark's and from the held-out
clips that measure it (``measure``).

``tiny:vlm-perceiver`` resolves to ``$EMBODIED_R_HOME/models/tiny-vlm-perceiver-<hash>``,
trained on first use; the hash covers the settings and the source of every module the
training and its data depend on, so a change to a prompt or to the world retrains it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from embodied_r.backends.base import BackendConfig, Conversation
from embodied_r.backends.tiny_models import TRAINED, TinyVLMSpec, _build_atomically, ensure_tiny_vlm, home
from embodied_r.perception import prompts
from embodied_r.perception.parse import FrameInfo, frame_reply, normalize_action
from embodied_r.runners import modules_version
from embodied_r.synthetic.views import KINDS, ROOM_NAMES, URBAN_NAMES, Clip, make_clips

log = logging.getLogger(__name__)

PERCEIVER_REF = "tiny:vlm-perceiver"
NOTHING = "no objects in view"
NO_QUESTION_OBJECTS = "none"
# Seeds of the clips it learns from, and of the held-out clips that measure it; the demo's
# benchmark draws from other random streams altogether (``synthetic.urban`` / ``vsi``).
TRAIN_SEED = 100_000
# The reply form it is taught: the stage's default prompt style (``prompts.PAPER_STYLE``),
# which its conversations are built in.
REPLY_FORMAT = prompts.PAPER_STYLE.reply_format
HELD_OUT_SEED = 900_000
_SOURCES = ("embodied_r.perception.perceiver", "embodied_r.perception.prompts",
            "embodied_r.perception.parse", "embodied_r.synthetic.views", "embodied_r.synthetic.world",
            "embodied_r.synthetic.urban", "embodied_r.synthetic.vsi", "embodied_r.backends.tiny_models",
            "embodied_r.backends.hf_local", "embodied_r.backends.images")


# Words of the replies and of the questions, for the tokenizer's merges.
_CORPUS = "\n".join([*URBAN_NAMES, *ROOM_NAMES, NOTHING, NO_QUESTION_OBJECTS,
                     '{"action": "", "new_info": "", "question_info": ""}',
                     "At the initial position, you are asked to navigate to the destination.",
                     "Which of the following objects do you see during the flight? ahead of me on my left",
                     "If I am standing by the and facing the, is the to the left or the right of the",
                     "What will be the first-time appearance order of the following categories in the video:"])


def _spec(**kw: Any) -> TinyVLMSpec:
    phrases = tuple(dict.fromkeys(
        [prompts.SYSTEM] + [make(fmt) for fmt in ("numbered", "json")
                            for make in (prompts.first_frame_instruction, prompts.pair_instruction,
                                         prompts.scene_instruction, prompts.video_pair_instruction)]))
    return TinyVLMSpec(phrases=phrases, corpus=_CORPUS, **kw)


class PerceiverTraining(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: TinyVLMSpec = _spec(hidden_size=96, intermediate_size=192, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2,
                              vision_hidden_size=64, vision_depth=2, vision_heads=2)
    worlds: int = Field(24, ge=2)  # synthetic worlds, half outdoor flights, half room scans
    # Key-frame sequences drawn from each world: the panorama is the costly part of a world.
    chains: int = Field(8, ge=1)
    steps: int = Field(300, ge=1)
    batch_size: int = Field(16, ge=1)
    learning_rate: float = 3e-3
    max_pixels: int = 112 * 112  # the demo backend's budget: what the model sees at run time
    jpeg_side: int = 320  # the key-frame stage's jpeg_max_side in the demo
    balance: float = Field(0.5, ge=0.0, le=1.0)  # 0: actions drawn as they come, 1: evenly
    threads: int = Field(1, ge=1)
    init_std: float = Field(0.02, ge=0.0)  # 0 keeps the tiny build's own random weights
    seed: int = 0

    def digest(self) -> str:
        payload = {"settings": self.model_dump(), "code": modules_version(list(_SOURCES))}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


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
               ) -> list[tuple[Conversation, FrameInfo, bool]]:
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


def make_items(seed: int, worlds: int, chains: int, folder: Path, side: int
               ) -> list[tuple[Conversation, FrameInfo, bool]]:
    items = []
    rng = np.random.default_rng(seed)
    for w in range(worlds):
        kind = KINDS[w % len(KINDS)]
        # One world, several key-frame sequences: the panorama is the costly part.
        for c, clip in enumerate(make_clips(seed + w, kind, chains)):
            items += clip_items(clip, folder, f"w{w}c{c}", side, rng)
    return items


# -- training -----------------------------------------------------------------------------


def encode_items(backend: Any, items: list[tuple[Conversation, FrameInfo, bool]]) -> list[dict[str, Any]]:
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


def _loss(model: Any, batch: Any, keep: int, targets: Any) -> Any:
    import torch

    logits = model(**batch, logits_to_keep=keep).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100)


def sampling_weights(items: list[tuple[Conversation, FrameInfo, bool]], balance: float) -> np.ndarray:
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


def _reinitialise(model: Any, std: float) -> None:
    """Weights drawn anew at a scale that trains: the tiny build's wide random weights make
    varied text untrained, but saturate the vision tower."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv3d)):
                module.weight.normal_(0.0, std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()


def train_perceiver(folder: Path, cfg: PerceiverTraining) -> dict[str, Any]:
    """Train the tiny VLM in place of ``ensure_tiny_vlm``'s random one and save it to ``folder``."""
    import torch

    from embodied_r.backends.hf_local import TransformersBackend

    started = time.perf_counter()
    base = ensure_tiny_vlm(home() / "models", cfg.spec)
    backend = TransformersBackend(BackendConfig(kind="transformers", model=str(base), device="cpu",
                                                max_pixels=cfg.max_pixels))
    model = backend.model
    torch.manual_seed(cfg.seed)
    if cfg.init_std:
        _reinitialise(model, cfg.init_std)
    rng = np.random.default_rng(cfg.seed)
    with tempfile.TemporaryDirectory(prefix="perceiver-") as tmp:
        items = make_items(TRAIN_SEED + cfg.seed * 1000, cfg.worlds, cfg.chains, Path(tmp), cfg.jpeg_side)
        encoded = encode_items(backend, items)
    made = time.perf_counter() - started
    weights = sampling_weights(items, cfg.balance)
    pad_id = backend.tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.01)
    warm = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps)))
    threads = torch.get_num_threads()
    # Ops this small run faster on one thread than on two that wait for each other, and
    # much faster when other processes share the cores.
    torch.set_num_threads(cfg.threads)
    model.train()
    losses = []
    try:
        for step in range(cfg.steps):
            chunk = [encoded[i] for i in rng.choice(len(encoded), cfg.batch_size, replace=False, p=weights)]
            loss = _loss(model, *collate(chunk, pad_id))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if step % 10 == 0 or step == cfg.steps - 1:
                log.info("perceiver step %d/%d loss %.3f", step + 1, cfg.steps, losses[-1])
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(folder)
    for f in base.iterdir():
        if not (folder / f.name).exists() and f.suffix != ".safetensors":
            shutil.copy2(f, folder / f.name)
    report = {"items": len(items), "steps": cfg.steps, "data_seconds": round(made, 1),
              "train_seconds": round(time.perf_counter() - started, 1),
              "first_loss": losses[0], "last_loss": float(np.mean(losses[-10:]))}
    (folder / "perceiver_training.json").write_text(json.dumps(report, indent=1))
    return report


# -- measuring -------------------------------------------------------------------------------


def _named(text: str, names: tuple[str, ...]) -> set[str]:
    text = text.lower()
    return {n for n in names if n in text}


def measure(model: str | Path, clips: int = 12, seed: int = HELD_OUT_SEED, side: int = 320,
            max_pixels: int = 112 * 112, batch_size: int = 16, max_new_tokens: int = 48) -> dict[str, Any]:
    """Action and object scores of a perceiver on held-out clips, read through the stage's
    own prompts, backend and parser.

    ``action_accuracy``: share of frame pairs whose action is named right.
    ``object_recall``: of the objects truly in view, over all frames, the share named;
    ``object_precision``: of the objects named, the share truly in view (naming every object
    scores a full recall and a poor precision).
    """
    from embodied_r.backends.factory import make_backend

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="perceiver-eval-") as tmp:
        items = []
        for w in range(clips):
            clip = make_clips(seed + w, KINDS[w % len(KINDS)])[0]
            items += clip_items(clip, Path(tmp), f"w{w}", side, rng)
        backend = make_backend(BackendConfig(kind="transformers", model=str(model), device="cpu",
                                             max_pixels=max_pixels, batch_size=batch_size,
                                             max_new_tokens=max_new_tokens))
        try:
            gens = backend.generate([conv for conv, _, _ in items])
        finally:
            backend.close()
    return {**score_replies([(want, first) for _, want, first in items], [g.text for g in gens]),
            "reply_tokens": float(np.mean([g.completion_tokens for g in gens])),
            "example": gens[1].text if len(gens) > 1 else ""}


def score_replies(truths: list[tuple[FrameInfo, bool]], replies: list[str]) -> dict[str, Any]:
    """Replies read by the stage's parser against the truth of their calls (see ``measure``)."""
    from embodied_r.perception.parse import parse_frame_response

    names = URBAN_NAMES + ROOM_NAMES
    actions_right = pairs = hits = in_view = named_total = 0
    for (want, first), text in zip(truths, replies):
        got = parse_frame_response(text, first, REPLY_FORMAT)
        if not first:
            pairs += 1
            actions_right += got.action == want.action
        truth_set = set() if want.new_info == NOTHING else set(want.new_info.split(", "))
        named = _named(got.new_info, names)
        hits += len(truth_set & named)
        in_view += len(truth_set)
        named_total += len(named)
    return {"frames": len(truths), "pairs": pairs,
            "action_accuracy": actions_right / pairs if pairs else 0.0,
            "object_recall": hits / in_view if in_view else 1.0,
            "object_precision": hits / named_total if named_total else 0.0}


def ensure_perceiver(root: Path | None = None, cfg: PerceiverTraining = PerceiverTraining()) -> Path:
    """The trained perceiver's folder, trained on first use."""
    root = Path(root) if root else home() / "models"
    return _build_atomically(root / f"tiny-vlm-perceiver-{cfg.digest()}", lambda f: train_perceiver(f, cfg))


# ``resolve_model("tiny:vlm-perceiver")`` trains or finds it wherever perception is imported.
TRAINED[PERCEIVER_REF] = ensure_perceiver
