"""Download, catalog, convert and an Embodied-Reasoner SFT stage killed for real (SIGKILL to the
process group) in the middle of their work: the rerun ends with exactly the files (for SFT, the
weights) an uninterrupted run writes, and leaves no ``.partial`` folder, temporary file or held
lock behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from embodied_r.benchmarks import vsibench
from embodied_r.data.catalog import run_catalog
from embodied_r.data.config import CatalogConfig, DownloadConfig
from embodied_r.data.download import run_download
from embodied_r.io import OUTPUTS_KEY, partial_path
from embodied_r.training.records import run_records
from embodied_r.training.records_config import RecordsConfig
from tests.killing import assert_clean_finish, files, kill_at_item, lock_is_free
from tests.data.test_download_catalog import _mirror
from tests.stage_inputs import VIDEO, catalog_row, download_raw, write_inputs

# Timings differ from run to run; everything else in a summary must not.
TIMINGS = ("seconds", "hash_seconds")


def summary(folder: Path, per_run: tuple[str, ...] = ()) -> dict[str, Any]:
    # The sizes the summary records (``io.OUTPUTS_KEY``) include the volatile files': the files
    # themselves are compared by ``assert_same_output``.
    return {k: v for k, v in json.loads((folder / "summary.json").read_text()).items()
            if k not in TIMINGS + per_run + (OUTPUTS_KEY,)}


def assert_same_output(resumed: Path, whole: Path, volatile: tuple[str, ...] = ("summary.json",),
                       per_run: tuple[str, ...] = ()) -> None:
    assert_clean_finish(resumed)
    assert files(resumed, volatile) == files(whole, volatile)
    assert summary(resumed, per_run) == summary(whole, per_run)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _mirror(tmp_path_factory.mktemp("mirror"))


@pytest.fixture(scope="module")
def raw(mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return download_raw(mirror, tmp_path_factory)


# The mirror's items: 12 UrbanVideo clips and MCQ.parquet, then VSI-Bench's Parquet file and
# its zip (15 files linked), then the zip's 4 videos extracted (items 16 to 19).
@pytest.mark.parametrize("n, linked, extracted", [(6, 6, 0), (17, 15, 2)])
def test_killed_download_resumes_to_the_uninterrupted_result(mirror: Path, raw: Path, tmp_path: Path,
                                                             n: int, linked: int, extracted: int) -> None:
    cfg = DownloadConfig(source="local", source_dir=str(mirror))
    out = tmp_path / "raw"
    code = (
        "from pathlib import Path\n"
        "from embodied_r.data.config import DownloadConfig\nfrom embodied_r.data.download import run_download\n"
        f"run_download(Path({str(out)!r}), DownloadConfig.model_validate_json({cfg.model_dump_json()!r}),\n"
        f"             Path({str(tmp_path / 'sources')!r}))\n"
    )
    kill_at_item(code, "download", n, tmp_path)
    work = partial_path(out)
    assert not out.exists() and work.is_dir()
    brought = [p for p in work.rglob("*") if p.is_file()]
    videos = work / vsibench.BENCHMARK.folder / "videos"
    assert len(brought) == linked + extracted
    assert len(list(videos.rglob("*.mp4")) if videos.exists() else []) == extracted
    assert lock_is_free(out)

    resumed = run_download(out, cfg, tmp_path / "sources")
    assert_same_output(out, raw, per_run=("extracted",))
    # "extracted" counts this run's work: the rerun extracted only what the killed run had not.
    assert resumed["extracted"] == 4 - extracted


@pytest.mark.parametrize("n", [1, 3])  # after catalog.parquet; after the DuckDB file, before the summary
def test_killed_catalog_resumes_to_the_uninterrupted_result(raw: Path, tmp_path: Path, n: int) -> None:
    cfg = CatalogConfig(tasks="all")
    whole = tmp_path / "whole"
    run_catalog(raw, whole, cfg)
    out = tmp_path / "catalog"
    code = (
        "from pathlib import Path\n"
        "from embodied_r.data.catalog import run_catalog\nfrom embodied_r.data.config import CatalogConfig\n"
        f"run_catalog(Path({str(raw)!r}), Path({str(out)!r}),\n"
        f"            CatalogConfig.model_validate_json({cfg.model_dump_json()!r}))\n"
    )
    kill_at_item(code, "preprocess", n, tmp_path)
    assert not out.exists() and (partial_path(out) / "catalog.parquet").is_file()
    assert (partial_path(out) / "catalog.duckdb").is_file() == (n == 3)

    run_catalog(raw, out, cfg)
    # A DuckDB file is not the same bytes twice: its tables and views are compared instead.
    assert_same_output(out, whole, volatile=("summary.json", "catalog.duckdb"))
    assert database(out / "catalog.duckdb") == database(whole / "catalog.duckdb")


def database(path: Path) -> dict[str, Any]:
    with duckdb.connect(str(path), read_only=True) as con:
        names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()]
        return {name: con.execute(f"SELECT * FROM {name} ORDER BY ALL").fetchall() for name in names}


# After train and val are written; after every table, before the summary.
@pytest.mark.parametrize("n, written", [(2, ["train.parquet", "val.parquet"]),
                                        (5, ["failures.parquet", "ood.parquet", "test.parquet", "train.parquet",
                                             "val.parquet"])])
def test_killed_convert_resumes_to_the_uninterrupted_result(tmp_path: Path, n: int, written: list[str]) -> None:
    rows = [catalog_row(f"urbanvideo:{i}", split=("train", "train", "val", "test")[i % 4]) for i in range(12)]
    texts = {r["uid"]: VIDEO for r in rows[:-1]}  # the last question has no perception text: a failure
    catalog, perception = write_inputs(tmp_path, rows, texts)
    whole = tmp_path / "whole"
    run_records(catalog, perception, whole, RecordsConfig())
    out = tmp_path / "records"
    code = (
        "from pathlib import Path\n"
        "from embodied_r.training.config import RecordsConfig\nfrom embodied_r.training.records import run_records\n"
        f"run_records(Path({str(catalog)!r}), Path({str(perception)!r}), Path({str(out)!r}), RecordsConfig())\n"
    )
    kill_at_item(code, "convert", n, tmp_path)
    assert sorted(p.name for p in partial_path(out).iterdir()) == written

    run_records(catalog, perception, out, RecordsConfig())
    assert_same_output(out, whole)
    assert summary(out)["failed"] == 1 and summary(out)["done"] == 11


def reasoner_trajectories(folder: Path, n: int = 4) -> Path:
    """The exploration stage's output: conversations with two views each, every other one with a
    refused step and its feedback (the stage-3 shape)."""
    from PIL import Image

    from embodied_r.interactive.prompts import FEEDBACK, IMAGE

    folder.mkdir(parents=True)
    trajectories = []
    for i in range(n):
        views = []
        for k in range(2):
            views.append(str(folder / f"view-{i}-{k}.png"))
            Image.new("RGB", (56, 56), (40 * i, 90 * k, 120)).save(views[-1])
        messages = [{"role": "system", "content": "You act in a house."},
                    {"role": "user", "content": f"{IMAGE}Pick up the apple {i}."},
                    {"role": "assistant", "content": "<DecisionMaking>navigate to apple</DecisionMaking>"}]
        if i % 2:
            messages += [{"role": "user", "content": f"{FEEDBACK}That action is not possible."},
                         {"role": "assistant", "content": "<Reflection>I must go first.</Reflection>"}]
        messages += [{"role": "user", "content": f"{IMAGE}The apple is in front of you."},
                     {"role": "assistant", "content": "<DecisionMaking>pickup apple</DecisionMaking>"}]
        trajectories.append({"id": f"t{i}", "images": views, "messages": messages})
    (folder / "trajectories.json").write_text(json.dumps(trajectories))
    return folder


@pytest.mark.slow  # three trainer processes
def test_killed_reasoner_sft_stage_resumes_from_its_checkpoint(tiny_vlm_path: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    """Killed after its step-2 checkpoint, the rerun trains steps 3 and 4 only, from the
    checkpoint's weights (the uninterrupted run's, to the bit), optimizer and data position."""
    from embodied_r.interactive.sft_config import ReasonerSFTConfig
    from embodied_r.interactive.stages import run_sft_stage
    from safetensors.torch import load_file

    cfg = ReasonerSFTConfig(use_cpu=True, learning_rate=1e-3, max_steps=4, warmup_ratio=0.0, max_pixels=56 * 56,
                            max_length=4096, save_steps=1, save_total_limit=10, gradient_checkpointing=False)
    config = {"sft": cfg.model_dump(mode="json"), "stage": 2, "name": "exploration"}
    inputs = {"trajectories": str(reasoner_trajectories(tmp_path / "explore")), "init_model": str(tiny_vlm_path)}
    whole = run_sft_stage(tmp_path / "whole", config, inputs)
    out = tmp_path / "killed"
    code = (
        "import json\n"
        "from pathlib import Path\n"
        "from embodied_r.interactive.stages import run_sft_stage\n"
        f"run_sft_stage(Path({str(out)!r}), json.loads({json.dumps(config)!r}), {inputs!r})\n"
    )
    kill_at_item(code, "train", 2, tmp_path)  # once the step-2 checkpoint is saved
    checkpoints = partial_path(out) / "checkpoints"
    assert (checkpoints / "checkpoint-2" / "trainer_state.json").is_file()
    assert not out.exists() and not (checkpoints / "checkpoint-3").exists()

    capsys.readouterr()
    resumed = run_sft_stage(out, config, inputs)
    assert_clean_finish(out)
    steps = [line.split()[2] for line in capsys.readouterr().out.splitlines()
             if line.split()[:2] == ["reasoner_sft_exploration", "step"]]
    assert steps == ["3/4", "4/4"]
    assert (resumed["resumed_from_step"], resumed["steps_this_run"], resumed["steps"]) == (2, 2, 4)
    before, after = (load_file(str(folder / "model" / "model.safetensors")) for folder in (tmp_path / "whole", out))
    assert before.keys() == after.keys() and all((before[k] == after[k]).all() for k in before)
    assert resumed["final_loss"] == whole["final_loss"] and whole["resumed_from_step"] == 0
    assert (out / "model" / "preprocessor_config.json").is_file()  # the VLM's image processor beside it
