"""Fixtures shared by the whole test suite."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

if TYPE_CHECKING:
    from tests.servers import ScriptedModels, ScriptedReference

# Prefect's telemetry fails offline and leaves "database is locked" tracebacks.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# The ephemeral API server's start budget the CLI sets (embodied_r.apps.cli._setup_env): Prefect
# reads it once, at import, before a test's in-process `main()` could set it, and its own 20 s
# are too short on a loaded machine.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")

# Flows run in this process start Prefect's ephemeral server on the database under
# PREFECT_HOME: each test process (pytest-xdist runs several) has its own, so no two wait
# on one SQLite file's lock, and none touches the user's ~/.prefect. Set before anything imports
# Prefect, which reads its settings once.
os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix=f"prefect-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)

# Each test process's share of the cores for torch's OpenMP thread pool (and the trainer
# children's, which inherit it): with two processes each spreading over both cores of a
# 2-core machine the learning demo's setup took 800 s, with one thread each 414 s. Set before
# anything imports torch.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
if _WORKERS > 1:
    _SHARE = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, _SHARE)


def _prefect_logging_on_the_process_stderr() -> None:
    """Configure Prefect's logging now, its console handler on the process's own stderr.

    Prefect configures its logging when a test first touches it, and its console handler keeps
    the ``sys.stderr`` of that moment: inside a test that captures its output (``capsys``), a
    stream pytest closes when that test ends, and every later Prefect log line of the process
    fails on it ("I/O operation on closed file"; within a flow that logs its prints, in a
    recursion that fails the run). Which test that is depends on the order tests run in. The
    process's own stderr stays open, and pytest's default capture (of the file descriptors)
    still collects what is written there."""
    from prefect.logging.configuration import ensure_logging_setup

    test_stream = sys.stderr
    sys.stderr = sys.__stderr__
    try:
        ensure_logging_setup()
    finally:
        sys.stderr = test_stream


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # pytest-xdist's controller: it runs no test
    _prefect_logging_on_the_process_stderr()


ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    # Tests run against the working tree whether or not the package is installed.
    sys.path.insert(0, str(ROOT))


def _shared_dir() -> Path | None:
    """The project's ``shared/`` folder (real benchmark files), found from this checkout:
    inside it, beside it (``../shared``), or beside the main checkout of a git worktree."""
    candidates = [ROOT / "shared", ROOT.parent / "shared"]
    git = ROOT / ".git"
    if git.is_file() and git.read_text().startswith("gitdir:"):
        # <main>/.git/worktrees/<name>: shared/ sits beside <main>.
        gitdir = (ROOT / git.read_text().split(":", 1)[1].strip()).resolve()
        candidates.append(gitdir.parents[2].parent / "shared")
    return next((c for c in candidates if c.is_dir()), None)


SHARED = _shared_dir()


# The files that take half a minute or more, longest first (their tests' times summed from
# `--durations=0`). Under pytest-xdist
# (`make test`, files whole to a worker, in this order) each worker starts one of the longest
# at once, and the short files fill in beside them to the end; left in name order, a long file
# reached late runs on alone.
LONGEST_FIRST = (
    "test_learning_demo.py",
    "test_experiment_run.py",
    "test_e2e_deployments.py",
    "test_interrupts.py",
    "test_fault_losses.py",
    "test_interactive_pipeline.py",
    "test_flow_demo.py",
    "test_fault_disk.py",
    "test_learning.py",
    "test_e2e_shards.py",
    "test_gpu_check.py",
    "test_sft.py",
    "test_mlflow_ui_links.py",
    "test_training.py",
    "test_fault_secrets.py",
    "test_fault_exit.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _WORKERS > 1:
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def embodied_r_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point ``EMBODIED_R_HOME`` at a private folder for the whole session, so no test
    reads or writes the user's ``~/.embodied-r``."""
    home = tmp_path_factory.mktemp("embodied_r_home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBODIED_R_HOME", str(home))
        # The developer's own trainer interpreter or tracking server must not leak in.
        for name in ("EMBODIED_R_TRAIN_PYTHON", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "PREFECT_API_URL"):
            mp.delenv(name, raising=False)
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        yield home



@pytest.fixture(autouse=True)
def _home_restored(embodied_r_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `embodied-r --home DIR`, called in process, sets EMBODIED_R_HOME for the process; the
    # home each test started with comes back after it, so later tests find their cached models.
    monkeypatch.setenv("EMBODIED_R_HOME", os.environ.get("EMBODIED_R_HOME", str(embodied_r_home)))

@pytest.fixture()
def reference() -> Iterator[ScriptedReference]:
    """A consistency reference on 127.0.0.1 that answers what the reasoning says (``REF=``)."""
    from tests.servers import ScriptedReference

    server = ScriptedReference()
    yield server
    server.stop()


@pytest.fixture()
def scripted(request: pytest.FixtureRequest) -> Iterator[ScriptedModels]:
    """Models on 127.0.0.1 that answer by the test module's ``script_reply(model, messages)``."""
    from tests.servers import ScriptedModels

    server = ScriptedModels(request.module.script_reply)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_lm_path(embodied_r_home: Path) -> Path:
    """A tiny random-weight Qwen2 causal LM with tokenizer, built once per session."""
    from embodied_r.demo.tiny_models import ensure_tiny_lm

    return ensure_tiny_lm(embodied_r_home / "models")


@pytest.fixture(scope="session")
def tiny_vlm_path(embodied_r_home: Path) -> Path:
    """A tiny random-weight Qwen2.5-VL model, tokenizer and image processor, built once."""
    from embodied_r.demo.tiny_models import ensure_tiny_vlm

    return ensure_tiny_vlm(embodied_r_home / "models")


@pytest.fixture(scope="session")
def tiny_qwen2_vl_path(tiny_vlm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen2-VL (the class of Embodied-Reasoner's released models), with
    the tiny Qwen2.5-VL's tokenizer, image processor and language-model shape."""
    import shutil

    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    src = Qwen2_5_VLConfig.from_pretrained(tiny_vlm_path)
    text = src.text_config.to_dict()
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=dict(depth=1, embed_dim=32, hidden_size=text["hidden_size"], num_heads=2, mlp_ratio=2),
        image_token_id=src.image_token_id, video_token_id=src.video_token_id,
        vision_start_token_id=src.vision_start_token_id, vision_end_token_id=src.vision_end_token_id,
        tie_word_embeddings=True)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-qwen2-vl")
    model = Qwen2VLForConditionalGeneration(config)
    model.save_pretrained(folder)
    for item in tiny_vlm_path.iterdir():
        if item.name not in ("config.json", "model.safetensors") and item.is_file():
            shutil.copy(item, folder / item.name)
    return folder
