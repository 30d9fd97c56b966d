"""Bad input is named early, in one line that says what to fix: at ``embodied-r validate`` or
when a run starts where it can be, never after minutes of work, never as another library's
puzzling error."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embodied_r.apps.cli import build_parser, main
from embodied_r.errors import DiskSpaceError, StageBusy

ROOT = Path(__file__).resolve().parents[2]


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("text", ["", "\n", "# nothing set yet\n", "{}\n"])
def test_an_empty_recipe_is_refused(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(text)
    assert main(["validate", "--recipe", str(recipe)]) == 2
    err = _err(capsys)
    assert "is empty" in err and "extends: paper" in err and str(recipe) in err


def test_an_openai_backend_without_a_server_is_named_at_validate_and_at_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBODIED_R_NO_SUCH_KEY", raising=False)
    sets = ["--set", "perception.backend.kind=openai", "--set", "perception.backend.model=vlm",
            "--set", "perception.backend.api_key_env=EMBODIED_R_NO_SUCH_KEY"]
    assert main(["validate", "--recipe", "smoke", *sets]) == 2
    err = _err(capsys)
    assert err.startswith("error: perception.backend:") and "base_url" in err and "EMBODIED_R_NO_SUCH_KEY" in err
    # A run stops before its first stage, not when perception starts.
    home = tmp_path / "home"
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    started = time.monotonic()
    assert main(["--home", str(home), "run", "--recipe", "smoke", *sets]) == 2
    assert _err(capsys).startswith("error: perception.backend:")
    assert time.monotonic() - started < 30 and not (home / "stages").exists()
    # With a server named it validates.
    assert main(["validate", "--recipe", "smoke", *sets, "--set", "perception.backend.base_url=http://127.0.0.1:9/v1"]) == 0


def test_the_busy_stage_message_names_only_flags_that_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from embodied_r.io import stage_folder

    final = tmp_path / "stages" / "perception" / "abc"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom embodied_r.io import stage_lock\n"
         "with stage_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(60)\n", str(final)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setenv("EMBODIED_R_LOCK", "fail")  # what --no-wait sets
        with pytest.raises(StageBusy) as caught:
            with stage_folder(final):
                pass
    finally:
        holder.kill()
        holder.wait()
    known = {flag for action in build_parser()._actions for flag in action.option_strings}
    named = set(re.findall(r"--[a-z][a-z-]+", str(caught.value)))
    assert named and named <= known, f"{named - known} named but not flags of embodied-r"


def test_the_disk_check_prints_sizes_in_units_that_show_them(tiny_lm_path: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from embodied_r.training import disk
    from embodied_r.training.environment import TrainerEnvironment

    # A full disk, simulated where the check reads the free space.
    monkeypatch.setattr(disk, "free_bytes", lambda path: 20_000)
    with pytest.raises(DiskSpaceError) as caught:
        disk.check_disk(tmp_path / "out", str(tiny_lm_path), TrainerEnvironment(), steps=10, what="train_stage1")
    text = str(caught.value)
    assert "0.0 GB" not in text and "0.00 GB" not in text
    assert re.search(r"needs about \d+(\.\d)? (MB|kB) of disk .* but 20\.0 kB are free", text), text


def test_a_model_folder_that_does_not_exist_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from embodied_r.backends.base import BackendConfig
    from embodied_r.backends.factory import make_backend

    missing = tmp_path / "runs" / "model"
    with pytest.raises(FileNotFoundError, match=f"model folder {missing} does not exist"):
        make_backend(BackendConfig(kind="transformers", model=str(missing), device="cpu"))
    assert main(["--home", str(tmp_path / "home"), "eval-model", str(missing), "--recipe", "smoke", "--no-track"]) != 0
    err = _err(capsys)
    assert f"model folder {missing} does not exist" in err and "Repo id" not in err


def test_questions_left_out_are_counted_on_the_console(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.data.test_download_catalog import _mirror

    mirror = _mirror(tmp_path / "mirror")  # one question's answer, Z, is not among its options
    home = tmp_path / "home"
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    for stage in ("download", "preprocess"):
        assert main(["--home", str(home), stage, "--recipe", "smoke", "--source", str(mirror)]) == 0, \
            capsys.readouterr().err
    out = capsys.readouterr().out
    line = next(text for text in out.splitlines() if text.startswith("[stage] preprocess") and "done" in text)
    listed = next(home.glob("stages/preprocess/*/failures.parquet"))
    assert re.search(r"\b[1-9]\d* left out \(.*answer_not_an_option [1-9]", line), line
    assert str(listed) in line


def test_promotion_on_an_empty_split_is_refused_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    sets = ["--set", "catalog.split.val=0", "--set", "catalog.split.train=0.75"]
    assert main(["validate", "--recipe", "smoke", *sets]) == 2
    err = _err(capsys)
    assert "tracking.promote" in err and "catalog.split.val" in err
    assert main(["validate", "--recipe", "smoke", *sets, "--set", "tracking.promote_split=test"]) == 0


def test_promotion_on_a_split_the_catalog_left_empty_stops_after_the_catalog(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.data.test_download_catalog import _mirror

    # A share too small for any scene of this mirror to land in the validation split.
    mirror = _mirror(tmp_path / "mirror")
    home = tmp_path / "home"
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    sets = ["--source", str(mirror), "--set", "catalog.split={train: 0.79, val: 0.01, test: 0.2, seed: 0, folds: 2}"]
    assert main(["--home", str(home), "run", "--recipe", "smoke", *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "tracking.promote" in err and "no val questions" in err, err
    assert not (home / "stages" / "keyframes").exists()
