"""EgoSchema and MVBench's egocentric tasks as evaluation-only benchmarks, on invented content in
their real layouts: a mirror laid out like the hub repos (EgoSchema's ``Subset`` Parquet and
chunked video zips, MVBench's ``json/<task>.json`` and ``video/<source>.zip``) goes through the
download stage, the catalog (lettered options, answers as letters, every question in ``ood``),
key frames of real tiny videos, perception and scoring through the OpenAI-compatible backend.

In every invented question only the right option names a lantern, so a model that picks the
lantern's line is right exactly when the catalog's answer letter is."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied_r.benchmarks import egoschema, mvbench, registry
from embodied_r.benchmarks.base import OOD, SPLITS, lettered_options
from embodied_r.data.catalog import assign_splits, run_catalog
from embodied_r.data.config import CatalogConfig, DownloadConfig, SplitConfig
from embodied_r.data.download import run_download
from embodied_r.io import sha256_file
from embodied_r.synthetic.world import write_motion_video
from tests.servers import ScriptedModels, text_of
from tests.stage_inputs import download_raw

LANTERN = "lantern"
THINGS = ["a broom", "a kettle", "a ladder", "a basket", "a rope"]
COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def _choices(n: int, right: int, verb: str) -> list[str]:
    return [f"{verb} {'the ' + LANTERN if i == right else THINGS[i]}" for i in range(n)]


# question_idx -> (video_idx, answer as the file holds it, options): the lantern is the answer
# where the answer is an index of the options; the last two rows cannot be scored.
EGOSCHEMA = {
    "q-a1": ("clip-alpha", "3", [f"{chr(65 + i)}. {t}" for i, t in enumerate(_choices(5, 3, "c lifts"))]),
    "q-a2": ("clip-beta", "0", _choices(5, 0, "c hangs up")),
    "q-a3": ("clip-alpha", "4", _choices(5, 4, "c polishes")),
    "q-bad": ("clip-gamma", "7", _choices(5, 1, "c drops")),
    "q-none": ("clip-gamma", None, _choices(5, 2, "c finds")),
}
EGOSCHEMA_LETTERS = {"egoschema:q-a1": "D", "egoschema:q-a2": "A", "egoschema:q-a3": "E"}
# entries of MVBench's egocentric_navigation.json: (video, candidates, index of the answer or None)
NAVIGATION = [
    ("route_01.mp4", _choices(4, 2, "walk towards"), 2),
    ("route_02.mp4", _choices(3, 0, "turn to"), 0),
    ("route_01.mp4", _choices(4, 1, "stop at"), None),  # its answer is no candidate
]
MVBENCH_LETTERS = {"mvbench:egocentric_navigation:0": "C", "mvbench:egocentric_navigation:1": "A"}


def _clip(folder: Path, name: str, seed: int) -> Path:
    return write_motion_video(folder / name, [("turn right", 3.0, 40.0)], seed=seed, width=160, height=90, fps=10.0)


def _zip(archive: Path, members: dict[str, Path]) -> None:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w") as zf:
        for name, path in members.items():
            zf.write(path, name)


def _egoschema_table(rows: dict[str, tuple], integers: bool = False) -> pa.Table:
    """The subset's columns; ``integers``: ids and answers stored as integers (ids by position)."""
    number = pa.int64() if integers else pa.string()
    schema = pa.schema([("question_idx", number), ("question", pa.string()), ("video_idx", pa.string()),
                        ("option", pa.list_(pa.string())), ("answer", number)])
    return pa.Table.from_pylist([
        {"question_idx": i if integers else q, "question": f"What does c do with the items near the door? ({q})",
         "video_idx": video, "option": options,
         "answer": int(answer) if integers and answer is not None else answer}
        for i, (q, (video, answer, options)) in enumerate(rows.items())], schema=schema)


def make_mirror(root: Path, clips: Path) -> Path:
    """The two repos as ``hf download --local-dir`` leaves them, with files the pipeline does not need."""
    ego = root / egoschema.BENCHMARK.folder
    (ego / "Subset").mkdir(parents=True)
    pq.write_table(_egoschema_table(EGOSCHEMA), ego / egoschema.FILE)
    (ego / "GENERATION").mkdir()
    pq.write_table(_egoschema_table({"q-full": ("clip-delta", "", _choices(5, 0, "c opens"))}),
                   ego / "GENERATION" / "test-00000-of-00001.parquet")
    (ego / "README.md").write_text("card")
    _zip(ego / "videos_chunked_01.zip", {"videos/clip-alpha.mp4": _clip(clips, "a.mp4", 1),
                                         "videos/clip-unasked.mp4": _clip(clips, "u.mp4", 2)})
    _zip(ego / "videos_chunked_02.zip", {"videos/clip-beta.mp4": _clip(clips, "b.mp4", 3),
                                         "videos/clip-gamma.mp4": _clip(clips, "g.mp4", 4)})
    mv = root / mvbench.BENCHMARK.folder
    (mv / "json").mkdir(parents=True)
    nav = [{"video": video, "question": f"Where should you head to reach the shed? (nav {i})", "candidates": cands,
            "answer": cands[right] if right is not None else "fly upwards"}
           for i, (video, cands, right) in enumerate(NAVIGATION)]
    (mv / "json" / "egocentric_navigation.json").write_text(json.dumps(nav))
    (mv / "json" / "action_sequence.json").write_text(json.dumps([
        {"video": "X1.mp4", "question": "What came first?", "candidates": ["a", "b"], "answer": "a",
         "start": 1.5, "end": 9.0}]))
    _zip(mv / "video" / "vlnqa.zip", {"vlnqa/route_01.mp4": _clip(clips, "r1.mp4", 5),
                                      "vlnqa/route_02.mp4": _clip(clips, "r2.mp4", 6),
                                      "vlnqa/route_99.mp4": _clip(clips, "r9.mp4", 7)})
    _zip(mv / "video" / "star.zip", {"star/X1.mp4": _clip(clips, "x1.mp4", 8)})
    (mv / "README.md").write_text("card")
    note = mv / ".cache" / "huggingface" / "download" / "json" / "egocentric_navigation.json.metadata"
    note.parent.mkdir(parents=True)
    note.write_text(f"{COMMIT}\netag\n1700000000.0\n")
    return root


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mirror(tmp_path_factory.mktemp("mirror"), tmp_path_factory.mktemp("clips"))


OOD_ONLY = [egoschema.NAME, mvbench.NAME]


@pytest.fixture(scope="module")
def raw(mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return download_raw(mirror, tmp_path_factory, OOD_ONLY)


# -- the rules ------------------------------------------------------------------------------


def test_options_are_lettered_and_answers_become_letters() -> None:
    assert lettered_options(["A. c lifts it", "(B) c drops it", "c waves", "D) c sits", "A man waits"]) == [
        "A. c lifts it", "B. c drops it", "C. c waves", "D. c sits", "E. A man waits"]
    assert [egoschema.answer_letter(a, 5) for a in ("0", " 2 ", 4, "5", "-1", "B", "", None)] == [
        "A", "C", "E", None, None, None, None, None]
    cands = ["go left", "go  right", "stop"]
    assert [mvbench.answer_letter(a, cands) for a in ("go left", "go right ", "stop", "jump")] == [
        "A", "B", "C", None]
    assert mvbench.answer_letter("same", ["same", "other", "same"]) is None  # which one is meant?
    # Declared once: the roles, the splits each can be in, the files fetched.
    assert set(registry.NAMES) == set(registry.TRAINING_BENCHMARKS) | set(registry.EVALUATION_BENCHMARKS)
    assert [registry.splits_of(b) for b in registry.NAMES] == [SPLITS, SPLITS, (OOD,), (OOD,)]
    assert list(mvbench.BENCHMARK.tasks) == list(mvbench.EGOCENTRIC) == ["egocentric_navigation"]


# -- download and catalog -------------------------------------------------------------------


def test_mirror_download_brings_the_needed_files_and_extracts_only_the_asked_clips(mirror: Path, raw: Path) -> None:
    brought = {p.relative_to(raw).as_posix() for p in raw.rglob("*") if p.is_file()}
    manifest = json.loads((raw / "manifest.json").read_text())
    assert set(manifest["files"]) == {
        "EgoSchema/Subset/test-00000-of-00001.parquet", "EgoSchema/videos_chunked_01.zip",
        "EgoSchema/videos_chunked_02.zip", "MVBench/json/action_sequence.json",
        "MVBench/json/egocentric_navigation.json", "MVBench/video/vlnqa.zip"}
    for name, entry in manifest["files"].items():
        assert entry == {"size": (mirror / name).stat().st_size, "sha256": sha256_file(mirror / name)}
    assert manifest["benchmarks"]["egoschema"]["repo"] == "lmms-lab/egoschema"
    assert manifest["benchmarks"]["egoschema"]["revision"] is None  # that mirror carries no commit note
    assert manifest["benchmarks"]["mvbench"]["repo"] == "OpenGVLab/MVBench"
    assert manifest["benchmarks"]["mvbench"]["revision"] == COMMIT
    # The clips the questions use (a question left out later still asked for its clip), no other.
    videos = {n for n in brought if n.endswith(".mp4")}
    assert videos == {"EgoSchema/videos/videos/clip-alpha.mp4", "EgoSchema/videos/videos/clip-beta.mp4",
                      "EgoSchema/videos/videos/clip-gamma.mp4", "MVBench/videos/vlnqa/vlnqa/route_01.mp4",
                      "MVBench/videos/vlnqa/vlnqa/route_02.mp4"}
    assert json.loads((raw / "summary.json").read_text())["extracted"] == 5


def test_catalog_rows_in_the_lettered_form_all_in_the_ood_split(raw: Path, tmp_path: Path) -> None:
    summary = run_catalog(raw, tmp_path / "catalog", CatalogConfig())
    rows = {r["uid"]: r for r in pq.read_table(tmp_path / "catalog" / "catalog.parquet").to_pylist()}
    assert {u: r["answer"] for u, r in rows.items()} == {**EGOSCHEMA_LETTERS, **MVBENCH_LETTERS}
    for r in rows.values():
        assert [o[:3] for o in r["options"]] == [f"{chr(65 + i)}. " for i in range(len(r["options"]))]
        assert LANTERN in r["options"][ord(r["answer"]) - 65]  # the answer's letter names the right option
        assert (r["split"], r["fold"], r["answer_type"]) == (OOD, 0, "choice")
        assert Path(r["video_path"]).is_file() and str(raw) in r["video_path"]
    ego = rows["egoschema:q-a1"]
    assert ego["options"][0] == "A. c lifts a broom"  # the file's own "A. " is not doubled
    assert (ego["category"], ego["video_id"], ego["original_id"]) == ("egoschema_subset", "egoschema/clip-alpha", "q-a1")
    assert ego["question"] == "What does c do with the items near the door? (q-a1)"
    nav = rows["mvbench:egocentric_navigation:0"]
    assert (nav["category"], nav["video_id"]) == ("egocentric_navigation", "mvbench/vlnqa/route_01.mp4")
    assert rows["egoschema:q-a3"]["video_path"] == ego["video_path"]  # one clip, two questions

    reasons = {r["item"]: r["reason"] for r in pq.read_table(tmp_path / "catalog" / "failures.parquet").to_pylist()}
    assert set(reasons) == {"egoschema:q-bad", "egoschema:q-none", "mvbench:egocentric_navigation:2"}
    assert reasons["egoschema:q-bad"].startswith("answer_not_an_option: answer '7' is not the 0-based index")
    assert reasons["egoschema:q-none"].startswith("answer_unknown: ")
    assert reasons["mvbench:egocentric_navigation:2"].startswith("answer_not_an_option: answer 'fly upwards'")
    assert all("\n" not in r for r in reasons.values())
    assert summary["counts"] == {"egoschema": {"egoschema_subset": {"ood": 3}},
                                 "mvbench": {"egocentric_navigation": {"ood": 2}}}
    assert (summary["n_train"], summary["n_val"], summary["n_test"], summary["n_ood"]) == (0, 0, 0, 5)
    with duckdb.connect(str(tmp_path / "catalog" / "catalog.duckdb"), read_only=True) as con:
        assert con.execute("SELECT split, count(*) FROM questions GROUP BY ALL").fetchall() == [("ood", 5)]

    # Every task of the files: a task about a stretch of its video is refused, by name.
    every = run_catalog(raw, tmp_path / "all", CatalogConfig(tasks="all"))
    assert every["questions"] == 5 and every["failure_reasons"]["segment_unsupported"] == 1


def test_integer_columns_of_the_subset_are_read_as_text(tmp_path: Path) -> None:
    """Whatever types the hub's Parquet gives question_idx and answer, the rows are the same."""
    ego = tmp_path / "raw" / egoschema.BENCHMARK.folder
    (ego / "videos").mkdir(parents=True)
    for clip in ("clip-alpha", "clip-beta"):
        (ego / "videos" / f"{clip}.mp4").write_bytes(b"stand-in")
    (ego / "Subset").mkdir()
    rows = {k: v for k, v in EGOSCHEMA.items() if k in ("q-a1", "q-a2")}
    pq.write_table(_egoschema_table(rows, integers=True), ego / egoschema.FILE)
    run_catalog(tmp_path / "raw", tmp_path / "catalog", CatalogConfig())
    got = {r["uid"]: r["answer"] for r in pq.read_table(tmp_path / "catalog" / "catalog.parquet").to_pylist()}
    assert got == {"egoschema:0": "D", "egoschema:1": "A"}


def test_the_catalog_command_prints_the_ood_column(mirror: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from embodied_r.apps.cli_data import main as cli_main

    assert cli_main(["catalog", "--source", str(mirror), "--benchmarks", "egoschema,mvbench"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("benchmark"))
    assert header.split()[-5:] == ["train", "val", "test", "ood", "total"]
    assert next(line for line in lines if "egocentric_navigation" in line).split()[-5:] == ["0", "0", "0", "2", "2"]


def test_hub_fetch_pins_the_declared_revisions_and_fetches_only_the_needed_files(
        mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from tests.data.test_download_hub import SHA, _Hub

    remote = tmp_path / "remote"
    shutil.copytree(mirror / egoschema.BENCHMARK.folder, remote / "lmms-lab/egoschema")
    shutil.copytree(mirror / mvbench.BENCHMARK.folder, remote / "OpenGVLab/MVBench", ignore=shutil.ignore_patterns(".cache"))
    hub = _Hub(remote)
    pinned = DownloadConfig().hub.mvbench_revision
    monkeypatch.setitem(SHA, "lmms-lab/egoschema", "c" * 40)
    monkeypatch.setitem(SHA, "OpenGVLab/MVBench", pinned)
    monkeypatch.setattr(huggingface_hub, "HfApi", hub.api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    summary = run_download(tmp_path / "raw", DownloadConfig(source="hub", benchmarks=OOD_ONLY), tmp_path)
    # MVBench is asked for at its declared commit; EgoSchema's branch is resolved and recorded.
    assert summary["revisions"] == {"egoschema": "c" * 40, "mvbench": pinned} and len(pinned) == 40
    asked = {c["repo"]: c["revision"] for c in hub.calls if c["call"] == "dataset_info"}
    assert asked == {"lmms-lab/egoschema": "main", "OpenGVLab/MVBench": pinned}
    got = {p.relative_to(tmp_path / "raw").as_posix() for p in (tmp_path / "raw").rglob("*")
           if p.is_file() and not p.name.endswith(".mp4")}
    assert got == {"EgoSchema/Subset/test-00000-of-00001.parquet", "EgoSchema/videos_chunked_01.zip",
                   "EgoSchema/videos_chunked_02.zip", "MVBench/json/action_sequence.json",
                   "MVBench/json/egocentric_navigation.json", "MVBench/video/vlnqa.zip", "manifest.json",
                   "summary.json"}


# -- never trained on -----------------------------------------------------------------------


def _mixed_rows() -> list[dict]:
    return [{"benchmark": b, "scene": f"{b}-s{s}", "uid": f"{b}:{s}:{i}"}
            for b in registry.NAMES for s in range(6) for i in range(1 + s % 3)]


@pytest.mark.parametrize("rule", ["per_benchmark", "pooled_scenes"])
def test_no_split_rule_puts_an_evaluation_benchmark_in_training(rule: str) -> None:
    for seed in range(8):
        for train, val, test in ((0.75, 0.05, 0.2), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)):
            rows = _mixed_rows()
            assign_splits(rows, SplitConfig(train=train, val=val, test=test, seed=seed, rule=rule))
            for r in rows:
                if registry.evaluation_only(r["benchmark"]):
                    assert (r["split"], r["fold"]) == (OOD, 0)
                else:
                    assert r["split"] in SPLITS
            if train == 1.0:
                assert {r["split"] for r in rows if not registry.evaluation_only(r["benchmark"])} == {"train"}


def test_the_convert_stage_keeps_held_out_questions_out_of_training(tmp_path: Path) -> None:
    from tests.stage_inputs import VIDEO, catalog_row, write_inputs
    from embodied_r.training.records import run_records
    from embodied_r.training.records_config import RecordsConfig

    rows = [catalog_row("urbanvideo:1", "train"), catalog_row("egoschema:q1", OOD, benchmark=egoschema.NAME),
            # A catalog made elsewhere that put held-out questions in training, or ours in ood.
            catalog_row("egoschema:q2", "train", benchmark=egoschema.NAME),
            catalog_row("urbanvideo:2", OOD)]
    catalog, perception = write_inputs(tmp_path, rows, {r["uid"]: VIDEO for r in rows})
    summary = run_records(catalog, perception, tmp_path / "records", RecordsConfig())
    assert (summary["records_train"], summary["records_ood"]) == (1, 1)
    assert [r["uid"] for r in pq.read_table(tmp_path / "records" / "train.parquet").to_pylist()] == ["urbanvideo:1"]
    assert [r["uid"] for r in pq.read_table(tmp_path / "records" / "ood.parquet").to_pylist()] == ["egoschema:q1"]
    assert summary["failure_reasons"] == {"split_against_benchmark_role": 2}


def test_a_recipe_names_them_for_evaluation(tmp_path: Path) -> None:
    from embodied_r.apps.cli_eval import register
    from embodied_r.config import load_recipe
    from embodied_r.errors import RecipeError
    from embodied_r.pipeline import plan

    both = {"download": {"benchmarks": list(registry.NAMES)}, "evaluation": {"split": "ood"}}
    recipe = load_recipe("paper", both)
    stages = plan(recipe, tmp_path)
    assert stages["download"].config["benchmarks"] == list(registry.NAMES)
    assert stages["evaluate"].config["split"] == "ood"
    with pytest.raises(RecipeError, match=r"evaluation.split is 'ood'.*download.benchmarks names none"):
        load_recipe("paper", {"evaluation": {"split": "ood"}})
    with pytest.raises(RecipeError, match=r"synthetic source makes urbanvideo and vsibench only, not egoschema"):
        load_recipe("demo", {"download": {"benchmarks": ["urbanvideo", "egoschema"]}})
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["eval-model", "some/checkpoint", "--split", "ood"]).split == "ood"


# -- key frames, perception and scoring -----------------------------------------------------


def script_reply(model: str, messages: list[dict[str, Any]]) -> str:
    if model == "perceiver":
        return f"1. Action: move forward\n2. New spatial information: a shed and a {LANTERN}\n3. Question-related: none"
    # The reasoner picks the option line that names the lantern.
    text = messages[-1]["content"]
    letter = next(m.group(1) for m in re.finditer(r"^([A-E])\. (.*)$", text, re.M) if LANTERN in m.group(2))
    return f"<think>the {LANTERN} is in option {letter}</think><answer>{letter}</answer>"


def test_key_frames_perception_and_scoring_with_letters(raw: Path, scripted: ScriptedModels, tmp_path: Path) -> None:
    from embodied_r.evaluation.config import EvaluationConfig
    from embodied_r.evaluation.stage import run_evaluation
    from embodied_r.keyframes.config import KeyframeConfig
    from embodied_r.keyframes.stage import run_keyframes
    from embodied_r.perception.stage import run_perception
    from embodied_r.perception.config import PerceptionConfig
    from embodied_r.training.records import run_records
    from embodied_r.training.records_config import RecordsConfig

    run_catalog(raw, tmp_path / "catalog", CatalogConfig())
    catalog = tmp_path / "catalog" / "catalog.parquet"
    kf = run_keyframes(catalog, tmp_path / "keyframes", KeyframeConfig(min_frames=2, max_frames=3, workers=1,
                                                                       cache=False))
    assert kf["failed"] == 0 and kf["videos"] == 4  # two EgoSchema clips, two routes
    perceived = run_perception(catalog, tmp_path / "keyframes", tmp_path / "perception", PerceptionConfig(
        backend=scripted.backend("perceiver", max_pixels=64 * 64), max_new_tokens=32))
    assert perceived["done"] == 5 and perceived["failed"] == 0
    # Each perception call carried the key frames as images.
    calls = [r for r in scripted.requests if r["model"] == "perceiver"]
    assert all(any(p.get("type") == "image_url" for m in r["messages"] if isinstance(m["content"], list)
                   for p in m["content"]) for r in calls)

    converted = run_records(catalog, tmp_path / "perception", tmp_path / "records", RecordsConfig())
    assert (converted["records_train"], converted["records_val"], converted["records_test"],
            converted["records_ood"]) == (0, 0, 0, 5)
    # Scored by a model that reads only the options (it picks the lantern's line): every answer
    # is right exactly when each answer's letter points at the right option.
    metrics = run_evaluation(tmp_path / "records", "reasoner", tmp_path / "eval",
                             EvaluationConfig(split="ood", backend=scripted.backend("reasoner")))
    assert metrics["done"] == 5 and metrics["accuracy/overall"] == 1.0
    ood = pq.read_table(tmp_path / "records" / "ood.parquet").to_pylist()
    assert {r["uid"]: r["solution"] for r in ood} == {**EGOSCHEMA_LETTERS, **MVBENCH_LETTERS}
    assert all("E. " in r["prompt"] for r in ood if r["benchmark"] == egoschema.NAME)  # five options asked
    assert metrics["accuracy/egoschema_subset"] == 1.0 and metrics["accuracy/egocentric_navigation"] == 1.0
    assert "accuracy/paper_tasks" not in metrics  # transfer is never mixed into the paper's average
    preds = {p["uid"]: p["prediction"] for p in pq.read_table(tmp_path / "eval" / "predictions.parquet").to_pylist()}
    assert preds == {**EGOSCHEMA_LETTERS, **MVBENCH_LETTERS}
    # The reasoner was asked the question and its five (or three, four) lettered options.
    asked = [text_of(r["messages"]) for r in scripted.requests if r["model"] == "reasoner"]
    assert len(asked) == 5 and all("Frame 0: Observe:" in a for a in asked)
