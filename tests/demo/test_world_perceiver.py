"""The demo's stand-in perceiver: the synthetic benchmark's per-frame truth, the replies it
writes from that truth at chosen key frames (read back by the stage's own parser), its error
knobs, and its refusal of any video without truth."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from embodied_r import schemas
from embodied_r.backends.base import BackendConfig
from embodied_r.backends.factory import make_backend
from embodied_r.demo.world_perceiver import movement
from embodied_r.errors import WorldPerceiverError
from embodied_r.io import table_from_records, write_parquet_atomic
from embodied_r.perception import prompts
from embodied_r.perception.parse import parse_frame_response
from embodied_r.synthetic.config import SyntheticConfig
from embodied_r.synthetic.generate import make_synthetic_benchmark
from embodied_r.synthetic.truth import TRUTH_FILE


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    make_synthetic_benchmark(root, SyntheticConfig(urban_videos=2, clips_per_scene=2, vsi_scenes=0,
                                                   width=160, height=90, seconds=6))
    return root


def _stage_inputs(tmp: Path, bench: Path, frames: list[int]) -> tuple[Path, list[str]]:
    """A catalog naming one video and a key-frame folder keeping ``frames`` of it."""
    video_id = sorted(pq.read_table(bench / "UrbanVideo-Bench" / TRUTH_FILE).column("video_id").to_pylist())[0]
    catalog = tmp / "catalog.parquet"
    rows = [{"uid": "u:1", "video_id": video_id, "video_path": str(bench / "UrbanVideo-Bench" / "videos" / video_id)}]
    write_parquet_atomic(table_from_records(rows, schemas.CATALOG), catalog)
    kf = tmp / "keyframes"
    images = [f"frames/{video_id}/{i:04d}.jpg" for i in range(len(frames))]
    rows = [{"video_id": video_id, "rank": r, "frame_index": f, "timestamp": f / 30, "overlap": 0.0,
             "reason": "low_overlap", "image_path": p} for r, (f, p) in enumerate(zip(frames, images))]
    write_parquet_atomic(table_from_records(rows, schemas.KEYFRAMES), kf / "keyframes.parquet")
    return catalog, [str(kf / p) for p in images]


def test_truth_is_written_for_every_frame(bench):
    truth = pq.read_table(bench / "UrbanVideo-Bench" / TRUTH_FILE).to_pylist()
    videos = sorted(p.name for p in (bench / "UrbanVideo-Bench" / "videos").iterdir())
    assert sorted({r["video_id"] for r in truth}) == videos
    for r in truth:
        assert len(r["objects"]) == len(r["x"]) == len(r["bearing"]) == len(r["distance"])
        assert all(0 <= x <= 1 for x in r["x"]) and r["x"] == sorted(r["x"])


def test_replies_report_the_truth_at_the_chosen_frames(bench, tmp_path):
    truth = {r["frame_index"]: r for r in pq.read_table(bench / "UrbanVideo-Bench" / TRUTH_FILE).to_pylist()
             if r["video_id"] == sorted(pq.read_table(bench / "UrbanVideo-Bench" / TRUTH_FILE)
                                        .column("video_id").to_pylist())[0]}
    frames = [0, 15, 30, 45, 60]
    catalog, images = _stage_inputs(tmp_path, bench, frames)
    backend = make_backend(BackendConfig(kind="world"), catalog=catalog)
    named = truth[frames[-1]]["objects"][:1]
    question = prompts.question_with_options(f"Where is the {named[0] if named else 'red cube'}?", ["A. left"])
    convs = [prompts.first_frame_conversation(images[0], question)]
    convs += [prompts.pair_conversation(a, b, question) for a, b in zip(images, images[1:])]
    gens = backend.generate(convs)
    first = parse_frame_response(gens[0].text, True, "numbered")
    for name in truth[0]["objects"]:
        assert name in first.new_info
    for (a, b), gen in zip(zip(frames, frames[1:]), gens[1:]):
        info = parse_frame_response(gen.text, False, "numbered")
        assert info.action == movement(truth[a], truth[b])[0]
        for name in set(truth[b]["objects"]) - set(truth[a]["objects"]):
            assert f"the {name} is" in info.new_info
    last = parse_frame_response(gens[-1].text, False, "numbered")
    for name in named:
        assert f"the {name} is" in last.question_info
    # Seeded by the call: the same call gets the same reply.
    assert [g.text for g in backend.generate(convs)] == [g.text for g in gens]


def test_error_knobs_change_what_is_reported(bench, tmp_path):
    n = sum(1 for r in pq.read_table(bench / "UrbanVideo-Bench" / TRUTH_FILE).column("video_id").to_pylist()
            if r == min(pq.read_table(bench / "UrbanVideo-Bench" / TRUTH_FILE).column("video_id").to_pylist()))
    frames = list(range(0, n, 4))
    catalog, images = _stage_inputs(tmp_path, bench, frames)
    convs = [prompts.pair_conversation(a, b, "Q?") for a, b in zip(images, images[1:])]

    def actions(**world):
        gens = make_backend(BackendConfig(kind="world", world=world), catalog=catalog).generate(convs)
        return [parse_frame_response(g.text, False, "numbered") for g in gens]

    exact, wrong = actions(), actions(action_error_rate=1.0)
    assert all(a.action != b.action for a, b in zip(exact, wrong))
    missed = actions(object_miss_rate=1.0)
    assert all("the " not in m.new_info for m in missed)
    with pytest.raises(ValueError):
        actions(action_error_rate=2.0)


def test_videos_without_truth_are_refused_in_one_line(tmp_path):
    video = tmp_path / "real" / "videos" / "flight.mp4"
    video.parent.mkdir(parents=True)
    video.write_bytes(b"")
    catalog = tmp_path / "catalog.parquet"
    write_parquet_atomic(table_from_records([{"uid": "u:1", "video_id": "flight.mp4", "video_path": str(video)}],
                                            schemas.CATALOG), catalog)
    with pytest.raises(WorldPerceiverError) as err:
        make_backend(BackendConfig(kind="world"), catalog=catalog)
    assert "flight.mp4" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(WorldPerceiverError):
        make_backend(BackendConfig(kind="world"))


def test_errors_are_drawn_the_same_in_every_home(bench, tmp_path):
    rates = {"action_error_rate": 0.5, "object_miss_rate": 0.5, "false_object_rate": 0.5}
    replies = []
    for home in ("one", "two"):
        (tmp_path / home).mkdir()
        catalog, images = _stage_inputs(tmp_path / home, bench, [0, 10, 20, 30])
        convs = [prompts.pair_conversation(a, b, "Q?") for a, b in zip(images, images[1:])]
        replies.append([g.text for g in make_backend(BackendConfig(kind="world", world=rates),
                                                     catalog=catalog).generate(convs)])
    assert replies[0] == replies[1]
