"""Stages in shards: membership by id, the merged folder equal to an unsharded run's for
key frames, perception and evaluation, and a failed shard the only one done again (calls
counted on a real local OpenAI-compatible server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq
import pytest

from embodied_r.backends.base import BackendConfig
from embodied_r.evaluation.stage import run_evaluation
from embodied_r.errors import InfraFailure, TooManyFailures
from embodied_r.io import is_complete, partial_path
from embodied_r.keyframes.config import KeyframeConfig
from embodied_r.keyframes.stage import run_keyframes
from embodied_r.perception.stage import run_perception
from embodied_r.perception.config import PerceptionConfig
from embodied_r.shards import LOG_NAME, members, parse_selection, shard_folder, shard_of, shard_paths
from embodied_r.tracking.names import stage_metrics
from tests.evaluation.test_evaluation import _mixed_cfg, mixed  # noqa: F401 - a fixture
from tests.keyframes.test_keyframes import _catalog, videos  # noqa: F401 - a fixture
from tests.perception.test_perception import make_inputs
from tests.perception.test_perception_http import RecordingServer

# Figures that time a run or count its processes: they differ between any two runs.
TIMING = {"seconds", "seconds_per_item", "processing_seconds", "hash_seconds", "workers", "shards"}


def rows(folder: Path, name: str) -> str:
    """A table's rows in order, as text (so a missing overlap, NaN, equals itself)."""
    return json.dumps(pq.read_table(folder / name).to_pylist(), default=str)


def _untimed(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without the item journal's size: its lines carry each item's seconds."""
    outputs = summary.get("outputs")
    if not (isinstance(outputs, dict) and LOG_NAME in outputs):
        return summary
    return {**summary, "outputs": {**outputs, LOG_NAME: {k: v for k, v in outputs[LOG_NAME].items() if k != "bytes"}}}


def same_folders(a: Path, b: Path, tables: list[str], ignore: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Assert two stage folders hold the same rows in the same order and the same summary
    counts (but ``ignore``); returns ``b``'s summary."""
    for name in tables:
        assert rows(a, name) == rows(b, name), name
    sa, sb = (json.loads((f / "summary.json").read_text()) for f in (a, b))
    skip = TIMING | ignore
    assert ({k: v for k, v in _untimed(sa).items() if k not in skip}
            == {k: v for k, v in _untimed(sb).items() if k not in skip})
    assert not shard_paths(b)  # no shard left behind
    return sb


def test_membership_follows_the_id_alone() -> None:
    ids = [f"video-{i}" for i in range(40)]
    # Other items added in front or removed move no item to another shard.
    more = ["new-a", "new-b"] + ids[::2]
    for k in range(4):
        assert set(members(more, k, 4)) & set(ids) == set(members(ids, k, 4)) & set(more)
    assert sorted(sum((members(ids, k, 4) for k in range(4)), [])) == sorted(ids)
    assert all(len(members(ids, k, 4)) > 4 for k in range(4))
    # Pinned: a change of the rule would move finished items of existing shard folders.
    assert [shard_of(i, 2) for i in ("v1", "v2", "v3", "v4")] == [0, 1, 0, 0]
    assert parse_selection("2/4", 4) == 1 and parse_selection(None, 4) is None
    with pytest.raises(ValueError, match="shards: 3"):
        parse_selection("2/4", 3)


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    srv = RecordingServer()
    yield srv
    srv.stop()


def perceiver(srv: RecordingServer, **kw: Any) -> PerceptionConfig:
    backend = BackendConfig(kind="openai", model="vlm", base_url=srv.base_url, api_key_env="EMBODIED_R_TEST_NO_KEY",
                            max_retries=0, timeout_s=10.0, concurrency=2)
    return PerceptionConfig(backend=backend, max_new_tokens=64, max_failed_fraction=1.0, **kw)


VIDEOS = {"v1": 3, "v2": 1, "v3": 2, "v4": 4}
QUESTIONS = [("u:1", "v1"), ("u:2", "v3"), ("u:3", "v2"), ("u:4", "v3"), ("u:5", "v_none"), ("u:6", "v4"),
             ("u:7", "v1")]
PERCEPTION_TABLES = ["perception.parquet", "perception_frames.parquet", "failures.parquet"]


@pytest.mark.parametrize("mode", ["per_question", "per_video"])
def test_perception_in_shards_equals_one_run(server: RecordingServer, tmp_path: Path, mode: str) -> None:
    catalog, kf = make_inputs(tmp_path, VIDEOS, QUESTIONS)
    assert {shard_of(v, 2) for v in VIDEOS} == {0, 1}
    one = run_perception(catalog, kf, tmp_path / "one", perceiver(server, mode=mode))
    calls_one = len(server.bodies)
    two = run_perception(catalog, kf, tmp_path / "two", perceiver(server, mode=mode, shards=2))
    assert len(server.bodies) == 2 * calls_one  # each call once, in one shard or the other
    assert same_folders(tmp_path / "one", tmp_path / "two", PERCEPTION_TABLES) == two
    assert two["failed"] == one["failed"] == 1 and two["calls_made"] == one["calls_made"] == calls_one
    # Each shard's counts, and where it ran, in the summary and so in the stage's MLflow run.
    shards = two["shards"]
    assert shards["count"] == 2 and sum(shards["hosts"].values()) == 2
    assert shards["1"]["items"] + shards["2"]["items"] == len(VIDEOS)
    assert shards["1"]["done"] + shards["2"]["done"] == two["calls"]
    metrics = stage_metrics(two)
    assert metrics["summary/shards/1/done"] + metrics["summary/shards/2/done"] == two["calls"]


def _mentions(body: dict[str, Any], videos: set[str]) -> bool:
    return any(f"seen in {v}?" in json.dumps(body) for v in videos)


def test_a_failed_shard_is_the_only_one_done_again(tmp_path: Path) -> None:
    catalog, kf = make_inputs(tmp_path, VIDEOS, QUESTIONS)
    down: set[str] = {"v3"}  # shard 1 holds v1 and v4 (finished) and v3 (its server fails)
    srv = RecordingServer(fault=lambda body: (503, "unavailable") if _mentions(body, down) else None)
    ref = RecordingServer()
    try:
        out = tmp_path / "perception"
        with pytest.raises(InfraFailure) as failed:
            run_perception(catalog, kf, out, perceiver(srv, shards=2))
        assert "shard 1 of 2" in "\n".join(failed.value.__notes__)
        first, second = shard_folder(out, 0, 2), shard_folder(out, 1, 2)
        assert is_complete(second) and partial_path(first).is_dir() and not out.exists()
        logged = len((partial_path(first) / "items.jsonl").read_text().splitlines())
        sent = len(srv.bodies)

        down.clear()
        summary = run_perception(catalog, kf, out, perceiver(srv, shards=2))
        again = srv.bodies[sent:]
        assert again and not any(_mentions(b, {"v2"}) for b in again)  # the finished shard: nothing resent
        assert len(again) == summary["calls"] - logged - summary["shards"]["2"]["done"]  # its own finished calls kept
        run_perception(catalog, kf, tmp_path / "one", perceiver(ref))
        # Resumed, shard 1 counts only the calls its last run made.
        same_folders(tmp_path / "one", out, PERCEPTION_TABLES, frozenset({"calls_made", "calls_failed"}))
        assert summary["calls_made"] == len(again) + summary["shards"]["2"]["done"] and summary["failed"] == 1
    finally:
        srv.stop()
        ref.stop()


EVALUATION_TABLES = ["predictions.parquet", "failures.parquet"]


def test_evaluation_in_shards_equals_one_run(mixed: tuple[Any, Path], tmp_path: Path) -> None:  # noqa: F811
    server, records = mixed
    uids = [f"urbanvideo:{i}" for i in range(6)]
    # Five shards: the two failed questions land in shards in the reverse of their order, and
    # some shards are empty.
    assert shard_of("urbanvideo:4", 5) < shard_of("urbanvideo:1", 5)
    assert len({shard_of(u, 5) for u in uids}) < 5
    one = run_evaluation(records, "policy", tmp_path / "one", _mixed_cfg(server))
    # A shard left by an earlier recipe with another count: removed with the merged shards.
    (tmp_path / "many.shard-2-of-3.partial").mkdir()
    many = run_evaluation(records, "policy", tmp_path / "many", _mixed_cfg(server).model_copy(update={"shards": 5}))
    assert len(server.bodies) == 2 * len(uids)
    assert same_folders(tmp_path / "one", tmp_path / "many", EVALUATION_TABLES) == many
    assert (json.loads((tmp_path / "one/metrics.json").read_text())
            == json.loads((tmp_path / "many/metrics.json").read_text()))
    assert many["failed"] == 2 and sum(many["shards"][str(k)]["items"] for k in range(1, 6)) == 6


def test_too_many_failures_reopen_only_the_shards_that_had_them(mixed: tuple[Any, Path],  # noqa: F811
                                                                 tmp_path: Path) -> None:
    server, records = mixed
    out = tmp_path / "eval"
    strict = _mixed_cfg(server).model_copy(update={"shards": 3, "max_failed_fraction": 0.1})
    with pytest.raises(TooManyFailures):
        run_evaluation(records, "policy", out, strict)
    failing = {shard_of(u, 3) for u in ("urbanvideo:1", "urbanvideo:4")}
    for k in range(3):
        folder = shard_folder(out, k, 3)
        assert (partial_path(folder).is_dir() and not folder.exists()) if k in failing else is_complete(folder)
    sent = len(server.bodies)
    # The share allowed raised (an operational setting: the same folder): only the two failed
    # questions are asked again.
    summary = run_evaluation(records, "policy", out, strict.model_copy(update={"max_failed_fraction": 1.0}))
    assert len(server.bodies) - sent == 2 and summary["failed"] == 2 and is_complete(out)


def test_keyframes_in_shards_equal_one_run(tmp_path: Path, videos: dict[str, Path]) -> None:  # noqa: F811
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00" * 3000)
    entries = [("fast", videos["fast"]), ("a/static", videos["static"]), ("junk", junk), ("mixed", videos["mixed"])]
    assert {shard_of(v, 2) for v, _ in entries} == {0, 1}
    catalog = _catalog(tmp_path / "catalog.parquet", entries)
    cfg = KeyframeConfig(workers=1, cache=False)
    one = run_keyframes(catalog, tmp_path / "one", cfg)
    two = run_keyframes(catalog, tmp_path / "two", cfg.model_copy(update={"shards": 2}))
    assert same_folders(tmp_path / "one", tmp_path / "two", ["keyframes.parquet", "failures.parquet"]) == two
    assert (one["done"], one["failed"]) == (3, 1)
    frames = {p.relative_to(tmp_path / "one"): p.read_bytes() for p in (tmp_path / "one/frames").rglob("*.jpg")}
    assert frames and frames == {p.relative_to(tmp_path / "two"): p.read_bytes()
                                 for p in (tmp_path / "two/frames").rglob("*.jpg")}
    assert (tmp_path / "one/montage.jpg").read_bytes() == (tmp_path / "two/montage.jpg").read_bytes()


def test_a_refresh_discards_the_shards_too(tmp_path: Path) -> None:
    from flows.runner import discard

    out = tmp_path / "stages/perception/abc"
    for folder in (out, shard_folder(out, 0, 2), partial_path(shard_folder(out, 1, 2)), shard_folder(out, 2, 3)):
        folder.mkdir(parents=True)
        (folder / "items.jsonl").write_text("{}\n")
    shard_folder(out, 0, 2).with_name(shard_folder(out, 0, 2).name + ".lock").write_text("")
    (tmp_path / "stages/perception/abcd.shard-1-of-2").mkdir()  # another stage's shard
    discard(out)
    assert not out.exists() and not shard_paths(out)
    assert [p.name for p in out.parent.iterdir()] == ["abcd.shard-1-of-2"]


def test_a_shard_run_on_its_own_calls_its_own_server(tmp_path: Path) -> None:
    """What a flow run of one shard does: shard i sends every call to server i mod n of the
    backend's servers; the run that follows only merges."""
    catalog, kf = make_inputs(tmp_path, VIDEOS, QUESTIONS)
    servers = [RecordingServer(), RecordingServer()]
    try:
        cfg = perceiver(servers[0], shards=2)
        cfg = cfg.model_copy(update={"backend": cfg.backend.model_copy(
            update={"base_url": None, "base_urls": [s.base_url for s in servers]})})
        out = tmp_path / "perception"
        counts = []
        for index in (1, 0):
            shard = run_perception(catalog, kf, out, cfg, shard=index)
            assert shard["shard"] == index + 1 and is_complete(shard_folder(out, index, 2)) and not out.exists()
            counts.append([len(s.bodies) for s in servers])
        assert counts[0][0] == 0 and counts[0][1] > 0  # shard 2 on server 2 alone
        assert counts[1][1] == counts[0][1] and counts[1][0] > 0  # then shard 1 on server 1 alone
        summary = run_perception(catalog, kf, out, cfg)
        assert [len(s.bodies) for s in servers] == counts[1] and summary["calls"] == sum(counts[1])
    finally:
        for s in servers:
            s.stop()


def test_a_shard_finished_while_waiting_for_its_lock_is_not_redone(server: RecordingServer, tmp_path: Path,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    """Two runs of one shard (a pipeline rerun while the first flow run still works): the
    second waits for the first and takes its result instead of doing the shard again."""
    import threading

    from embodied_r.io import stage_lock

    catalog, kf = make_inputs(tmp_path, VIDEOS, QUESTIONS)
    out = tmp_path / "perception"
    cfg = perceiver(server, shards=2)
    first = run_perception(catalog, kf, out, cfg, shard=0)
    sent = len(server.bodies)
    folder = shard_folder(out, 0, 2)
    aside = tmp_path / "aside"
    folder.rename(aside)  # as if still being worked on
    got: list[dict[str, Any]] = []
    with stage_lock(folder):
        second = threading.Thread(target=lambda: got.append(run_perception(catalog, kf, out, cfg, shard=0)))
        second.start()
        while "waiting for it to finish" not in capfd.readouterr().err:
            assert second.is_alive()
            second.join(0.01)
        aside.rename(folder)  # the first run ends
    second.join()
    assert got == [first] and len(server.bodies) == sent


def test_shards_given_to_a_stopped_stage_keep_its_finished_calls(tmp_path: Path) -> None:
    """A stage stopped unsharded (its server down), then run with shards: no finished call is
    sent again, and the result is the uninterrupted run's."""
    catalog, kf = make_inputs(tmp_path, VIDEOS, QUESTIONS)
    down = {"v3"}
    srv = RecordingServer(fault=lambda body: (503, "unavailable") if _mentions(body, down) else None)
    ref = RecordingServer()
    try:
        out = tmp_path / "perception"
        with pytest.raises(InfraFailure):
            run_perception(catalog, kf, out, perceiver(srv))
        logged = len((partial_path(out) / "items.jsonl").read_text().splitlines())
        assert logged > 0
        down.clear()
        sent = len(srv.bodies)
        summary = run_perception(catalog, kf, out, perceiver(srv, shards=2))
        assert len(srv.bodies) - sent == summary["calls"] - logged
        run_perception(catalog, kf, tmp_path / "one", perceiver(ref))
        same_folders(tmp_path / "one", out, PERCEPTION_TABLES, frozenset({"calls_made", "calls_failed"}))
    finally:
        srv.stop()
        ref.stop()
