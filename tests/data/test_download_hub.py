"""The hub source: which files are fetched, what the manifest records, and the errors.

The Hugging Face Hub cannot be reached from the machines these tests run on, so the two
network calls themselves (``HfApi.dataset_info`` and ``snapshot_download``) are not exercised
here. What is tested: the allow patterns (with huggingface_hub's own matcher), the error when
the hub is unreachable (a real connection to a closed port, and offline mode), and the code
around the two calls, with stand-ins for them that serve a local folder and record how they
were called.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from huggingface_hub.utils import filter_repo_objects

from embodied_r.benchmarks import registry, urbanvideo, vsibench
from embodied_r.benchmarks.base import arrow_schema
from embodied_r.data.config import DownloadConfig, HubConfig
from embodied_r.data.download import run_download
from embodied_r.data.hub import needed_files
from embodied_r.errors import DataSourceError
from embodied_r.settings import operational_fields
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
SHA = {"EmbodiedCity/UrbanVideo-Bench": "a" * 40, "nyu-visionx/VSI-Bench": "b" * 40}


def test_allow_patterns_pick_only_the_needed_files():
    urban = [".gitattributes", "README.md", "MCQ.parquet", "videos/EmbodiedCity_1.mp4",
             "videos/AerialVLN_2_X_0.mp4", "annotations/extra.json", "MCQ_old.parquet"]
    assert needed_files(urban, urbanvideo.NAME) == ["MCQ.parquet", "videos/AerialVLN_2_X_0.mp4",
                                                  "videos/EmbodiedCity_1.mp4"]
    vsi = [".gitattributes", "README.md", "arkitscenes.zip", "scannet.zip", "scannetpp.zip",
           "test-00000-of-00001.parquet", "test_debiased-00000-of-00001.parquet", "tools/eval.py"]
    assert needed_files(vsi, vsibench.NAME) == ["arkitscenes.zip", "scannet.zip", "scannetpp.zip",
                                              "test-00000-of-00001.parquet"]
    # The same patterns go to snapshot_download, which matches with this very function.
    for names, b in ((urban, urbanvideo.NAME), (vsi, vsibench.NAME)):
        assert sorted(filter_repo_objects(names, allow_patterns=registry.get(b).allow_patterns)) == needed_files(names, b)


def test_each_benchmark_brings_its_hub_repo_and_revision():
    """``download.hub`` has a repo and a revision for every benchmark of the list, from its module."""
    assert [HubConfig().repo(b.name) for b in registry.BENCHMARKS] == [(b.repo, b.revision) for b in registry.BENCHMARKS]
    assert operational_fields(HubConfig) == {"endpoint", "max_workers"}


@pytest.mark.parametrize("env", [
    {"HF_ENDPOINT": "http://127.0.0.1:{port}", "HF_HUB_OFFLINE": "0"},  # connection refused
    {"HF_HUB_OFFLINE": "1"},  # huggingface_hub's offline mode
])
def test_unreachable_hub_says_to_use_a_local_source(tmp_path, env):
    env = {k: v.format(port=free_port()) for k, v in env.items()}  # a port nobody listens on
    proc = subprocess.run(
        [sys.executable, "-m", "embodied_r.apps.cli_data", "fetch", "--hub", "--recipe", "paper"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "EMBODIED_R_HOME": str(tmp_path), "PYTHONPATH": str(ROOT), **env})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "cannot reach the Hugging Face Hub for EmbodiedCity/UrbanVideo-Bench" in err
    assert "--source DIR" in err and "download.source=local" in err
    assert ("ConnectError" in err) if "HF_ENDPOINT" in env else ("OfflineModeIsEnabled" in err)
    assert "Traceback" not in err
    assert not list((tmp_path / "stages" / "download").glob("*/summary.json"))


# --------------------------------------------------------------------------- stand-ins
def _remote(root: Path) -> Path:
    """Two repos as they sit on the hub, with files the pipeline does not need."""
    uv, vsi = root / "EmbodiedCity/UrbanVideo-Bench", root / "nyu-visionx/VSI-Bench"
    (uv / "videos").mkdir(parents=True)
    (uv / "README.md").write_text("card")
    (uv / "videos" / "EmbodiedCity_1_0.mp4").write_bytes(b"clip")
    pq.write_table(pa.Table.from_pylist([{"Question_id": 1, "video_id": "EmbodiedCity_1_0.mp4",
                                          "question_category": "Landmark Position",
                                          "question": "Question: Where?\nChoices:\nA. Left.\nB. Right.",
                                          "answer": "A"}], schema=arrow_schema(urbanvideo.COLUMNS)), uv / urbanvideo.FILE)
    vsi.mkdir(parents=True)
    (vsi / ".gitattributes").write_text("*.zip filter=lfs")
    pq.write_table(pa.Table.from_pylist([], schema=arrow_schema(vsibench.COLUMNS)), vsi / vsibench.FILE)
    shutil.make_archive(str(vsi / "scannet"), "zip", root_dir=root, base_dir="EmbodiedCity")  # any zip
    return root


class _Hub:
    """Stand-ins for ``HfApi`` and ``snapshot_download`` that serve ``root`` and record calls."""

    def __init__(self, root: Path):
        self.root = root
        self.calls: list[dict] = []
        self.corrupt: str | None = None  # a file served with wrong bytes once

    def api(self, endpoint=None):
        hub = self

        class Api:
            def dataset_info(self, repo, revision=None, files_metadata=False):
                hub.calls.append({"call": "dataset_info", "repo": repo, "revision": revision,
                                  "files_metadata": files_metadata, "endpoint": endpoint})
                base = hub.root / repo
                files = [p for p in base.rglob("*") if p.is_file()]
                return SimpleNamespace(sha=SHA[repo], siblings=[SimpleNamespace(
                    rfilename=p.relative_to(base).as_posix(), size=p.stat().st_size,
                    lfs=SimpleNamespace(sha256=hashlib.sha256(p.read_bytes()).hexdigest())) for p in files])

        return Api()

    def snapshot_download(self, repo_id, *, repo_type, revision, allow_patterns, local_dir, **kwargs):
        self.calls.append({"call": "snapshot_download", "repo": repo_id, "repo_type": repo_type,
                           "revision": revision, "allow_patterns": allow_patterns, "local_dir": str(local_dir)})
        base = self.root / repo_id
        names = [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()]
        for name in filter_repo_objects(names, allow_patterns=allow_patterns):
            dst = Path(local_dir) / name
            if dst.exists():  # what a resumed snapshot_download does with finished files
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base / name, dst)
            if name == self.corrupt:
                dst.write_bytes(b"garbled" + dst.read_bytes()[7:])
                self.corrupt = None
        return str(local_dir)


def test_hub_fetch_pins_the_resolved_commit_and_records_it(tmp_path, monkeypatch):
    hub = _Hub(_remote(tmp_path / "remote"))
    monkeypatch.setattr(huggingface_hub, "HfApi", hub.api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    hub.corrupt = urbanvideo.FILE
    cfg = DownloadConfig(source="hub")
    out = tmp_path / "raw"

    # A file that arrives damaged is caught against the hub's sha256 and removed ...
    with pytest.raises(DataSourceError, match=r"MCQ.parquet has the wrong sha256.*run the download again"):
        run_download(out, cfg, tmp_path / "sources")
    assert not (tmp_path / "raw.partial" / urbanvideo.BENCHMARK.folder / urbanvideo.FILE).exists()
    # ... and the next run fetches only what is missing.
    summary = run_download(out, cfg, tmp_path / "sources")
    assert summary["source"] == "hub" and summary["revisions"] == {"urbanvideo": "a" * 40, "vsibench": "b" * 40}

    info = [c for c in hub.calls if c["call"] == "dataset_info"]
    snaps = [c for c in hub.calls if c["call"] == "snapshot_download"]
    assert {(c["repo"], c["revision"], c["files_metadata"]) for c in info} == {
        ("EmbodiedCity/UrbanVideo-Bench", "main", True), ("nyu-visionx/VSI-Bench", "main", True)}
    for c in snaps:  # fetched at the resolved commit, never at the moving branch
        assert c["revision"] == SHA[c["repo"]] and c["repo_type"] == "dataset"
        assert Path(c["local_dir"]).parent == tmp_path / "raw.partial"
    assert {c["repo"]: c["allow_patterns"] for c in snaps} == {
        "EmbodiedCity/UrbanVideo-Bench": registry.get(urbanvideo.NAME).allow_patterns,
        "nyu-visionx/VSI-Bench": registry.get(vsibench.NAME).allow_patterns}

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"] == "hub"
    assert manifest["benchmarks"]["urbanvideo"] == {
        "repo": "EmbodiedCity/UrbanVideo-Bench", "requested_revision": "main", "revision": "a" * 40,
        "allow_patterns": registry.get(urbanvideo.NAME).allow_patterns, "files": 2,
        "bytes": sum(p.stat().st_size for p in (hub.root / "EmbodiedCity/UrbanVideo-Bench").rglob("*")
                     if p.suffix in (".parquet", ".mp4"))}
    assert set(manifest["files"]) == {"UrbanVideo-Bench/MCQ.parquet", "UrbanVideo-Bench/videos/EmbodiedCity_1_0.mp4",
                                      "VSI-Bench/test-00000-of-00001.parquet", "VSI-Bench/scannet.zip"}
    remote = {"UrbanVideo-Bench": hub.root / "EmbodiedCity/UrbanVideo-Bench", "VSI-Bench": hub.root / "nyu-visionx/VSI-Bench"}
    for name, entry in manifest["files"].items():
        folder, rest = name.split("/", 1)
        assert entry["sha256"] == hashlib.sha256((remote[folder] / rest).read_bytes()).hexdigest()
    assert not (out / urbanvideo.BENCHMARK.folder / "README.md").exists()  # only the needed files came


def test_hub_listing_without_the_question_file_names_the_fix(tmp_path, monkeypatch):
    hub = _Hub(_remote(tmp_path / "remote"))
    (hub.root / "nyu-visionx/VSI-Bench" / vsibench.FILE).unlink()
    monkeypatch.setattr(huggingface_hub, "HfApi", hub.api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    with pytest.raises(DataSourceError, match=r"nyu-visionx/VSI-Bench at b{40} has no test-00000-of-00001.parquet"
                                              r".*pin download.hub.vsibench_revision"):
        run_download(tmp_path / "raw", DownloadConfig(source="hub", benchmarks=["vsibench"]), tmp_path)
