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

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from embodied_r import progress
from embodied_r.backends.base import BackendConfig
from embodied_r.backends.tiny_models import TRAINED, TinyVLMSpec, _build_atomically, ensure_tiny_vlm, home
from embodied_r.perception import prompts
from embodied_r.perception.perceiver_data import (
    HELD_OUT_SEED,
    LOOKS,
    NAMES,
    NO_QUESTION_OBJECTS,
    NOTHING,
    TRAIN_SEED,
    clip_items,
    collate,
    encode_items,
    make_items,
    looks_in_view,
    sample_clips,
    sampling_weights,
    score_replies,
)
from embodied_r.keyframes.extract import KeyframeConfig
from embodied_r.runners import modules_version
from embodied_r.synthetic.views import KINDS

log = logging.getLogger(__name__)

PERCEIVER_REF = "tiny:vlm-perceiver"
_SOURCES = ("embodied_r.perception.perceiver", "embodied_r.perception.perceiver_data",
            "embodied_r.perception.prompts", "embodied_r.perception.parse", "embodied_r.synthetic.views",
            "embodied_r.synthetic.world", "embodied_r.synthetic.urban", "embodied_r.synthetic.vsi",
            "embodied_r.backends.tiny_models", "embodied_r.backends.hf_local", "embodied_r.backends.images",
            "embodied_r.keyframes.extract")


# Words of the replies and of the questions, for the tokenizer's merges.
_CORPUS = "\n".join([*NAMES, NOTHING, NO_QUESTION_OBJECTS,
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
                              vision_hidden_size=64, vision_depth=2, vision_heads=2, rope_theta=10.0)
    # Synthetic worlds, half outdoor flights, half room scans. Each has its own backdrop, and
    # what tells the objects from the backdrop in worlds never seen comes from seeing many.
    worlds: int = Field(144, ge=2)
    # Key-frame sequences drawn from each world: the panorama is the costly part of a world.
    chains: int = Field(2, ge=1)
    # First the vision tower alone learns which objects each image shows (a linear read-out
    # of its mean image token); trained only through the replies, the language model settles
    # on what the question text predicts before the image tokens carry anything it can read.
    vision_steps: int = Field(1000, ge=0)
    vision_learning_rate: float = Field(3e-3, gt=0)
    # Then the whole model learns the replies, the objects read-out kept at this weight.
    steps: int = Field(400, ge=1)
    objects_weight: float = Field(1.0, ge=0.0)
    batch_size: int = Field(16, ge=1)
    learning_rate: float = Field(3e-3, gt=0)
    max_pixels: int = 112 * 112  # the demo backend's budget: what the model sees at run time
    jpeg_side: int = 320  # the key-frame stage's jpeg_max_side in the demo
    # The demo's key-frame sampling (``recipes/demo.yaml``): the pairs it learns from are
    # picked by the stage's own rule, so they are as far apart as the ones it will see.
    sample_fps: float = Field(4.0, gt=0)
    max_frames: int = Field(16, ge=2)
    balance: float = Field(0.5, ge=0.0, le=1.0)  # 0: actions drawn as they come, 1: evenly
    threads: int = Field(1, ge=1)
    init_std: float = Field(0.02, ge=0.0)  # 0 keeps the tiny build's own random weights
    seed: int = 0

    def keyframes(self) -> KeyframeConfig:
        return KeyframeConfig(sample_fps=self.sample_fps, max_frames=self.max_frames, jpeg_max_side=self.jpeg_side)

    def digest(self) -> str:
        payload = {"settings": self.model_dump(), "code": modules_version(list(_SOURCES))}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


# -- training -----------------------------------------------------------------------------


def _loss(model: Any, batch: Any, keep: int, targets: Any) -> Any:
    import torch

    logits = model(**batch, logits_to_keep=keep).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100)


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


def _objects_loss(model: Any, head: Any, chunk: list[dict[str, Any]], target: Any, merged: Any = None) -> Any:
    """The objects read-out's loss: the mean image token of each call's last image, through
    a linear head, against the objects that image shows. ``merged``: the vision tower's
    output for the chunk's images, when a forward has just computed it."""
    import torch

    thw = torch.cat([e["image_grid_thw"] for e in chunk])
    if merged is None:
        merged = model.model.visual(torch.cat([e["pixel_values"] for e in chunk]).type(model.model.visual.dtype),
                                    grid_thw=thw).pooler_output
    merge = model.config.vision_config.spatial_merge_size ** 2
    feats = torch.split(merged, [int(t.prod()) // merge for t in thw])
    last = np.cumsum([len(e["image_grid_thw"]) for e in chunk]) - 1
    pooled = torch.stack([feats[i].mean(0) for i in last])
    return torch.nn.functional.binary_cross_entropy_with_logits(head(pooled), target)


def _catch_vision(model: Any) -> tuple[dict[str, Any], Any]:
    """Keep the vision tower's merged output of each forward, so the objects read-out reuses
    the forward's image features rather than encoding every image a second time."""
    caught: dict[str, Any] = {}

    def hook(_module: Any, _args: Any, out: Any) -> None:
        # Taken at once: the model replaces ``pooler_output`` with per-image splits after.
        caught["merged"] = out.pooler_output

    return caught, model.model.visual.register_forward_hook(hook)


def _say(text: str) -> None:
    # Minutes of training inside the perception stage (or a first chat): a line now and
    # then on the terminal, as a training stage prints its steps.
    progress.say(f"  {'perceiver':<13} {text}")
    log.info("perceiver %s", text)


def _cosine(steps: int) -> Any:
    warm = max(1, steps // 20)
    return lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))


def train_perceiver(folder: Path, cfg: PerceiverTraining) -> dict[str, Any]:
    """Train the tiny VLM in place of ``ensure_tiny_vlm``'s random one and save it to ``folder``."""
    import torch

    from embodied_r.backends.hf_local import TransformersBackend

    started = time.perf_counter()
    _say(f"training once ({cfg.worlds} worlds, {cfg.vision_steps} vision steps, then {cfg.steps} steps); "
         f"kept in {folder.parent}")
    base = ensure_tiny_vlm(home() / "models", cfg.spec)
    backend = TransformersBackend(BackendConfig(kind="transformers", model=str(base), device="cpu",
                                                max_pixels=cfg.max_pixels))
    model = backend.model
    torch.manual_seed(cfg.seed)
    if cfg.init_std:
        _reinitialise(model, cfg.init_std)
    head = torch.nn.Linear(model.config.text_config.hidden_size, len(LOOKS))
    rng = np.random.default_rng(cfg.seed)
    with tempfile.TemporaryDirectory(prefix="perceiver-") as tmp:
        items = make_items(TRAIN_SEED + cfg.seed * 1000, cfg.worlds, cfg.chains, Path(tmp), cfg.jpeg_side,
                           cfg.keyframes())
        encoded = encode_items(backend, items)
    made = time.perf_counter() - started
    objects = torch.from_numpy(looks_in_view(items))
    weights = sampling_weights(items, cfg.balance)
    pad_id = backend.tokenizer.pad_token_id
    threads = torch.get_num_threads()
    # Ops this small run faster on one thread than on two that wait for each other, and
    # much faster when other processes share the cores.
    torch.set_num_threads(cfg.threads)
    model.train()
    vision_losses, losses = [], []
    try:
        opt = torch.optim.AdamW([*model.model.visual.parameters(), *head.parameters()],
                                lr=cfg.vision_learning_rate, weight_decay=0.01)
        for step in range(cfg.vision_steps):
            pick = rng.choice(len(encoded), cfg.batch_size, replace=False)
            loss = _objects_loss(model, head, [encoded[i] for i in pick], objects[pick])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            vision_losses.append(loss.item())
            if step % 100 == 0 or step == cfg.vision_steps - 1:
                _say(f"vision step {step + 1}/{cfg.vision_steps}  objects loss {loss.item():.3f}")
        opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=cfg.learning_rate, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(cfg.steps))
        caught, handle = _catch_vision(model)
        for step in range(cfg.steps):
            pick = rng.choice(len(encoded), cfg.batch_size, replace=False, p=weights)
            chunk = [encoded[i] for i in pick]
            loss = _loss(model, *collate(chunk, pad_id))
            total = loss + cfg.objects_weight * _objects_loss(model, head, chunk, objects[pick], caught.pop("merged")) \
                if cfg.objects_weight else loss
            total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if step % 50 == 0 or step == cfg.steps - 1:
                _say(f"step {step + 1}/{cfg.steps}  loss {losses[-1]:.3f}")
        handle.remove()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(folder)
    for f in base.iterdir():
        if not (folder / f.name).exists() and f.suffix != ".safetensors":
            shutil.copy2(f, folder / f.name)
    report = {"items": len(items), "vision_steps": cfg.vision_steps, "steps": cfg.steps,
              "data_seconds": round(made, 1), "train_seconds": round(time.perf_counter() - started, 1),
              "vision_last_loss": float(np.mean(vision_losses[-10:])) if vision_losses else None,
              "first_loss": losses[0], "last_loss": float(np.mean(losses[-10:]))}
    (folder / "perceiver_training.json").write_text(json.dumps(report, indent=1))
    return report


# -- measuring -------------------------------------------------------------------------------


def measure(model: str | Path, clips: int = 12, seed: int = HELD_OUT_SEED, side: int = 320,
            max_pixels: int = 112 * 112, batch_size: int = 16, max_new_tokens: int = 48,
            keyframes: KeyframeConfig | None = None) -> dict[str, Any]:
    """Action and object scores of a perceiver on held-out clips, read through the stage's
    own prompts, backend and parser.

    ``action_accuracy``: share of frame pairs whose action is named right.
    ``object_recall``: of the objects truly in view, over all frames, the share named;
    ``object_precision``: of the objects named, the share truly in view (naming every object
    scores a full recall and a poor precision).
    ``actions_by_setting``, beside ``action_guess`` and ``action_guess_by_setting``: whether
    the actions are read from the images or guessed from the setting (``score_replies``).
    """
    from embodied_r.backends.factory import make_backend

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="perceiver-eval-") as tmp:
        items, settings = [], []
        for w in range(clips):
            clip = sample_clips(seed + w, KINDS[w % len(KINDS)], 1, keyframes or PerceiverTraining().keyframes())[0]
            made = clip_items(clip, Path(tmp), f"w{w}", side, rng)
            items += made
            settings += [clip.kind] * len(made)
        backend = make_backend(BackendConfig(kind="transformers", model=str(model), device="cpu",
                                             max_pixels=max_pixels, batch_size=batch_size,
                                             max_new_tokens=max_new_tokens))
        try:
            gens = backend.generate([conv for conv, _, _ in items])
        finally:
            backend.close()
    return {**score_replies([(want, first) for _, want, first in items], [g.text for g in gens], settings),
            "reply_tokens": float(np.mean([g.completion_tokens for g in gens])),
            "example": gens[1].text if len(gens) > 1 else ""}


def guess_levels(scores: dict[str, Any]) -> str:
    """``measure``'s actions per setting beside what naming the commonest action scores."""
    by_setting = ", ".join(f"{'flights' if k == 'urban' else 'rooms'} {v:.3f}"
                           for k, v in scores["actions_by_setting"].items())
    return (f"actions by setting: {by_setting}; naming the commonest action scores {scores['action_guess']:.3f}, "
            f"the commonest of each setting {scores['action_guess_by_setting']:.3f}")


def ensure_perceiver(root: Path | None = None, cfg: PerceiverTraining = PerceiverTraining()) -> Path:
    """The trained perceiver's folder, trained on first use."""
    root = Path(root) if root else home() / "models"
    return _build_atomically(root / f"tiny-vlm-perceiver-{cfg.digest()}", lambda f: train_perceiver(f, cfg))


# ``resolve_model("tiny:vlm-perceiver")`` trains or finds it wherever perception is imported.
TRAINED[PERCEIVER_REF] = ensure_perceiver
