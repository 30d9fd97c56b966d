"""The demo's perceiver (``kind: world``): a stand-in for a frozen large VLM that writes what the synthetic
world truly shows at the key frames, as the perception prompts ask, with seeded error knobs."""

from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from embodied_r.backends.base import BackendConfig, Conversation, Generation
from embodied_r.errors import WorldPerceiverError
from embodied_r.perception.parse import normalize_action
from embodied_r.perception.prompts import ACTIONS
from embodied_r.synthetic.truth import TRUTH_FILE, side
from embodied_r.synthetic.world import HFOV

NOTHING = "nothing I can name"
NONE = "none"
PLACE = {"left": "on my left", "ahead": "ahead of me", "right": "on my right"}
_FLIGHT = {"fly forward": "move forward", "fly backward": "move backward", "rise": "move up",
           "descend": "move down", "turn left": "rotate left", "turn right": "rotate right"}


class WorldErrors(BaseModel):
    """How often the stand-in errs; each draw is seeded by the call, so that a rerun is identical."""

    model_config = ConfigDict(extra="forbid")

    action_error_rate: float = Field(0.0, ge=0, le=1)  # a pair's movement named wrong
    object_miss_rate: float = Field(0.0, ge=0, le=1)  # an object in view left out
    false_object_rate: float = Field(0.0, ge=0, le=1)  # per frame, one object named that is not there


def _find_up(path: Path, name: str, levels: int = 4) -> Path | None:
    for parent in list(path.parents)[:levels]:
        if (parent / name).is_file():
            return parent / name
    return None


@lru_cache(maxsize=64)
def _keyframe_index(folder: str) -> dict[str, tuple[str, int, int]]:
    rows = pq.read_table(Path(folder) / "keyframes.parquet",
                         columns=["video_id", "frame_index", "rank", "image_path"]).to_pylist()
    return {str(Path(folder) / r["image_path"]): (r["video_id"], r["frame_index"], r["rank"]) for r in rows}


@lru_cache(maxsize=16)
def _truth(path: str) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for r in pq.read_table(path).to_pylist():
        out.setdefault(r["video_id"], {})[r["frame_index"]] = r
    return out


def _is_room(truth: dict[int, dict[str, Any]]) -> bool:
    # Rooms know distances (the scan turns on one spot); flights do not.
    return any(not math.isnan(d) for row in truth.values() for d in row["distance"])


def movement(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, float]:
    """The movement that changed the view most between two poses, in the prompts' words, and the
    turn in degrees (0 for the others)."""
    dyaw = (b["yaw"] - a["yaw"] + 180.0) % 360.0 - 180.0
    change = {"turn": abs(dyaw) / HFOV,
              "vertical": abs(b["pitch"] - a["pitch"]) * a["zoom"] / (HFOV * 0.5625),
              "fly": abs(math.log(b["zoom"] / a["zoom"]))}
    kind = max(change, key=change.get)
    if change[kind] < 1e-6:
        return normalize_action(_FLIGHT.get(b["motion"], "move forward")), 0.0
    if kind == "turn":
        return ("rotate right" if dyaw > 0 else "rotate left"), abs(dyaw)
    if kind == "vertical":
        return ("move up" if b["pitch"] > a["pitch"] else "move down"), 0.0
    return ("move forward" if b["zoom"] > a["zoom"] else "move backward"), 0.0


class WorldPerceiver:
    """A ``Backend`` for perception calls: per key frame the objects in view and where, per pair the movement."""

    def __init__(self, cfg: BackendConfig, catalog: Path | None = None):
        if catalog is None:
            raise WorldPerceiverError("the world perceiver serves the perception stage only (it needs the "
                                      "catalog); use a model backend (transformers, openai, vllm) here")
        self.cfg = cfg
        self.errors = WorldErrors.model_validate(cfg.world)
        rows = pq.read_table(catalog, columns=["video_id", "video_path"]).to_pylist()
        self.videos = {r["video_id"]: r["video_path"] for r in rows}
        self.names = self._vocabulary()
        self.rooms: dict[str, bool] = {}  # per video, found once rather than on every call

    def _truth_of(self, video_id: str) -> dict[int, dict[str, Any]]:
        path = self.videos.get(video_id)
        found = _find_up(Path(path), TRUTH_FILE) if path else None
        if found is None:
            raise WorldPerceiverError(
                f"video {video_id} has no {TRUTH_FILE} above it: the world perceiver reads the synthetic "
                "benchmark's truth only; use a VLM backend (kind: openai, vllm or transformers) for real video")
        return _truth(str(found))[video_id]

    def _vocabulary(self) -> tuple[str, ...]:
        names: set[str] = set()
        for vid in self.videos:
            for row in self._truth_of(vid).values():
                names.update(row["objects"])
        return tuple(sorted(names))

    def _frames(self, conversation: Conversation) -> tuple[list[tuple[str, int, int]], str]:
        images, text = [], ""
        for message in conversation:
            if message.get("role") != "user":
                continue
            for part in message["content"] if isinstance(message["content"], list) else []:
                if part.get("type") == "image":
                    images.append(part["path"])
                elif part.get("type") == "text":
                    text += part["text"]
        frames = []
        for image in images:
            kf = _find_up(Path(image), "keyframes.parquet")
            where = _keyframe_index(str(kf.parent)).get(str(Path(image))) if kf else None
            if where is None:
                raise WorldPerceiverError(f"image {image} is not a key frame of a key-frame stage folder: "
                                          "the world perceiver reads key frames the keyframes stage wrote")
            frames.append(where)
        return frames, text

    def _rng(self, frames: list[tuple[str, int, int]], text: str) -> np.random.Generator:
        # Seeded by what the call asks about, not by where the home lies: every home draws the same.
        key = json.dumps([[v, f] for v, f, _ in frames] + [text])
        digest = hashlib.sha256(key.encode()).digest()
        return np.random.default_rng([self.cfg.seed, int.from_bytes(digest[:8], "little")])

    def _seen(self, row: dict[str, Any], rng: np.random.Generator, room: bool) -> list[tuple[str, str]]:
        out = []
        for name, x, bearing, dist in zip(row["objects"], row["x"], row["bearing"], row["distance"]):
            if rng.random() < self.errors.object_miss_rate:
                continue
            where = PLACE[side(x)]
            if not math.isnan(dist):
                where += f" ({dist:.1f} m away, {abs(bearing):.0f} degrees {'right' if bearing >= 0 else 'left'})"
            out.append((name, where))
        if self.names and rng.random() < self.errors.false_object_rate:
            absent = [n for n in self.names if n not in row["objects"]]
            if absent:
                where = PLACE[("left", "ahead", "right")[int(rng.integers(3))]]
                if room:
                    where += f" ({rng.uniform(1, 4):.1f} m away, {rng.uniform(0, 25):.0f} degrees left)"
                out.append((absent[int(rng.integers(len(absent)))], where))
        return out

    @staticmethod
    def _say(seen: list[tuple[str, str]], empty: str) -> str:
        return "; ".join(f"the {n} is {w}" for n, w in seen) or empty

    def reply(self, conversation: Conversation) -> str:
        frames, text = self._frames(conversation)
        if not frames:
            raise WorldPerceiverError("a perception call without images")
        rng = self._rng(frames, text)
        truth = self._truth_of(frames[0][0])
        missing = [f for _, f, _ in frames if f not in truth]
        if missing:
            raise WorldPerceiverError(f"video {frames[0][0]}: frame {missing[0]} is not in its {TRUTH_FILE}: "
                                      "the benchmark was remade after its key frames; run the keyframes stage again")
        rows = [truth[f] for _, f, _ in frames]
        if frames[0][0] not in self.rooms:
            self.rooms[frames[0][0]] = _is_room(truth)
        room = self.rooms[frames[0][0]]
        question = text.rsplit("\nQuestion: ", 1)[1].lower() if "\nQuestion: " in text else None
        as_json = "JSON object" in text

        def about_question(seen: list[tuple[str, str]]) -> str:
            return self._say([(n, w) for n, w in seen if question and n in question], NONE)

        if "These are key frames" in text:  # per_video's question pass: one line per frame
            lines = {f"frame_{rank}": about_question(self._seen(r, rng, room)) for (_, _, rank), r in zip(frames, rows)}
            if as_json:
                return json.dumps(lines)
            return "\n".join(f"Frame {k.split('_')[1]}: {v}" for k, v in lines.items())
        seen = self._seen(rows[-1], rng, room)
        if len(rows) == 1:
            fields = {"new_info": self._say(seen, NOTHING)}
            if as_json and question is not None:
                fields["question_info"] = about_question(seen)
            return json.dumps(fields) if as_json else fields["new_info"]
        action, degrees = movement(rows[0], rows[1])
        if rng.random() < self.errors.action_error_rate:
            others = [a for a in ACTIONS if a != action]
            action, degrees = others[int(rng.integers(len(others)))], 0.0
        before = set(rows[0]["objects"])
        new = [(n, w) for n, w in seen if n not in before]
        turned = f"I turned about {round(degrees / 5) * 5:.0f} degrees. " if degrees >= 2.5 else ""
        fields = {"action": action, "new_info": turned + self._say(new, "nothing new")}
        if question is not None:
            fields["question_info"] = about_question(seen)
        if as_json:
            return json.dumps(fields)
        return "\n".join(f"{i}. {v}" for i, v in enumerate(fields.values(), 1))

    def generate(self, conversations: list[Conversation], *, schemas: Any = None,
                 max_new_tokens: int | None = None,
                 on_result: Callable[[int, Generation], None] | None = None) -> list[Generation]:
        out = []
        for i, conversation in enumerate(conversations):
            text = self.reply(conversation)
            gen = Generation(text=text, prompt_tokens=0, completion_tokens=len(text.split()))
            if on_result is not None:
                on_result(i, gen)
            out.append(gen)
        return out

    def close(self) -> None:
        pass
