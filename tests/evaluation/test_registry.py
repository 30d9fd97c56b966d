"""The MLflow model registry against real stores: SQLite in a temporary folder, and an
``mlflow server`` on 127.0.0.1 (slow)."""

from __future__ import annotations

import filecmp
import os
import shutil
import sys
from pathlib import Path

import pytest

from embodied_r.evaluation.config import EvaluationConfig
from embodied_r.evaluation.stage import run_evaluation
from embodied_r.backends.base import BackendConfig
from embodied_r.evaluation.registry import (ModelRef, alias_version, parse_model_uri, register_model_folder,
                                            resolve_model_uri, resolve_version, set_alias)
from embodied_r.errors import RegistryError
from embodied_r.evaluation.promotion import promote_if_better
from tests.evaluation.test_evaluation import records  # noqa: F401 - fixture

NAME = "embodied-r-reasoner"


@pytest.fixture()
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_parse_model_uri() -> None:
    assert parse_model_uri("models:/embodied-r-reasoner@champion") == ModelRef(NAME, alias="champion")
    assert parse_model_uri("models:/m/12") == ModelRef("m", version="12")
    assert ModelRef("m", version="3").uri == "models:/m/3"
    for bad in ("models:/m", "runs:/abc/model", "models:/m@a/extra", "/path/to/model"):
        with pytest.raises(RegistryError, match="models:/<name>@<alias>"):
            parse_model_uri(bad)


def test_register_alias_and_resolve_to_a_folder(tiny_lm_path: Path, store: str, tmp_path: Path) -> None:
    v1 = register_model_folder(tiny_lm_path, NAME, tracking_uri=store, tags={"recipe": "test"})
    v2 = register_model_folder(tiny_lm_path, NAME, tracking_uri=store)
    assert (v1.version, v2.version) == ("1", "2") or (int(v1.version), int(v2.version)) == (1, 2)
    assert v1.source.startswith("runs:/") and v1.source.endswith("/model") and v1.tags["recipe"] == "test"
    assert alias_version(NAME, "champion", store) is None

    set_alias(NAME, "champion", v1.version, store)
    assert resolve_version(f"models:/{NAME}@champion", store) == ModelRef(NAME, version=str(v1.version))
    cache = tmp_path / "cache"
    folder = Path(resolve_model_uri(f"models:/{NAME}@champion", store, cache_root=cache))
    assert folder == cache / NAME / f"v{v1.version}"
    assert not filecmp.dircmp(tiny_lm_path, folder).diff_files
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in tiny_lm_path.iterdir())
    # A version is immutable: the cached folder is used again, without the store.
    assert resolve_model_uri(f"models:/{NAME}/{v1.version}", store, cache_root=cache) == str(folder)
    assert not list(cache.glob(f"{NAME}/.*partial"))

    set_alias(NAME, "champion", v2.version, store)
    assert Path(resolve_model_uri(f"models:/{NAME}@champion", store, cache_root=cache)).name == f"v{v2.version}"
    with pytest.raises(RegistryError, match="promote"):
        resolve_model_uri(f"models:/{NAME}@staging", store, cache_root=cache)
    with pytest.raises(RegistryError, match="no alias"):
        resolve_model_uri("models:/unknown-model@champion", store, cache_root=cache)


def test_register_refuses_a_folder_without_a_model(store: str, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="config.json"):
        register_model_folder(tmp_path, NAME, tracking_uri=store)


def test_promotion_needs_a_strictly_better_score(tiny_lm_path: Path, store: str) -> None:
    versions = [str(register_model_folder(tiny_lm_path, NAME, tracking_uri=store).version) for _ in range(3)]
    scores = {f"models:/{NAME}/{versions[0]}": 0.40, f"models:/{NAME}/{versions[1]}": 0.40,
              f"models:/{NAME}/{versions[2]}": 0.55}
    asked: list[str] = []

    def score(uri: str) -> float:
        asked.append(uri)
        return scores[uri]

    first = promote_if_better(NAME, versions[0], score, tracking_uri=store)
    assert first.promoted and first.champion_version is None
    tie = promote_if_better(NAME, versions[1], score, tracking_uri=store)
    assert not tie.promoted and tie.champion_version == versions[0] and tie.champion_score == 0.40
    better = promote_if_better(NAME, versions[2], score, tracking_uri=store)
    assert better.promoted and "promoted to @champion" in better.describe()
    assert str(alias_version(NAME, "champion", store).version) == versions[2]
    # Both sides are scored by immutable version URIs, never by the moving alias.
    assert all("@" not in uri for uri in asked)
    again = promote_if_better(NAME, versions[2], score, tracking_uri=store)
    assert not again.promoted and again.champion_version == versions[2]

    from mlflow import MlflowClient

    tags = MlflowClient(tracking_uri=store, registry_uri=store).get_model_version(NAME, versions[2]).tags
    assert tags["score/accuracy/overall"] == "0.55"


def test_evaluate_a_registry_alias(records: Path, tiny_lm_path: Path, store: str, tmp_path: Path,  # noqa: F811
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    version = register_model_folder(tiny_lm_path, NAME, tracking_uri=store).version
    set_alias(NAME, "champion", version, store)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    cfg = EvaluationConfig(backend=BackendConfig(kind="transformers", device="cpu", batch_size=4),
                           max_new_tokens=8, chunk_size=4)
    summary = run_evaluation(records, f"models:/{NAME}@champion", tmp_path / "eval", cfg)
    assert summary["done"] == 6
    assert summary["model_ref"] == f"models:/{NAME}@champion"
    assert Path(summary["model"]).name == f"v{version}" and (Path(summary["model"]) / "config.json").is_file()
    assert f"models:/{NAME}@champion" in (tmp_path / "eval" / "report.md").read_text()


@pytest.mark.slow
def test_register_and_resolve_through_an_mlflow_server(tiny_lm_path: Path, tmp_path: Path) -> None:
    """A server checks a version's source against its run: ``runs:/<run>/model`` passes."""
    from tests.servers import serve_on_free_port

    if shutil.which("mlflow") is None and not (Path(sys.executable).parent / "mlflow").exists():
        pytest.skip("the mlflow command is not installed")
    mlflow_cmd = str(Path(sys.executable).parent / "mlflow")

    def cmd(port: int) -> list[str]:
        return [mlflow_cmd, "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1", "--port", str(port)]

    with serve_on_free_port(cmd, tmp_path / "server.log", dict(os.environ), timeout=120) as (_, port):
        uri = f"http://127.0.0.1:{port}"
        version = register_model_folder(tiny_lm_path, NAME, tracking_uri=uri)
        set_alias(NAME, "champion", version.version, uri)
        folder = Path(resolve_model_uri(f"models:/{NAME}@champion", uri, cache_root=tmp_path / "cache"))
        assert (folder / "config.json").read_bytes() == (tiny_lm_path / "config.json").read_bytes()


# -- the commands, on records written where the recipe's convert stage puts them -----------


@pytest.fixture()
def demo_home(tmp_path: Path, embodied_r_home: Path, tiny_lm_path: Path,
              monkeypatch: pytest.MonkeyPatch) -> Path:
    from embodied_r.config import load_recipe
    from embodied_r.pipeline import plan
    from embodied_r.training.records import run_records
    from embodied_r.training.records_config import RecordsConfig
    from tests.stage_inputs import VIDEO, catalog_row, write_inputs

    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(embodied_r_home / "models")  # the tiny models, built once
    monkeypatch.setenv("EMBODIED_R_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = [catalog_row(f"urbanvideo:{i}", split, answer="ABCD"[i % 4])
            for i, split in enumerate(["train", "val", "val", "test", "test", "test"])]
    catalog, perception = write_inputs(tmp_path, rows, {r["uid"]: VIDEO for r in rows})
    convert = plan(load_recipe("smoke"), home)["convert"]
    run_records(catalog, perception, Path(convert.out), RecordsConfig())
    return home


@pytest.fixture()
def promoting(demo_home: Path, tiny_lm_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """``register_and_promote`` on the smoke recipe's records (two val questions of four
    options: chance 25 %) against a real store, each model's score set by the test and the
    warm-started policy a folder; the evaluations it asks for are recorded."""
    from embodied_r.config import load_recipe
    from embodied_r.evaluation import promotion
    from embodied_r.lifecycle import promote
    from embodied_r.pipeline import plan

    state: dict = {"scores": {}, "asked": [], "warm": None, "recipe": load_recipe("smoke")}

    def evaluate(ref, split, **where):  # noqa: ANN001 - evaluation.models.evaluate_model's signature
        state["asked"].append((ref, split))
        value = state["scores"][ref] if split == "val" else 0.5
        return demo_home / "eval", {"accuracy/overall": value, "count/overall": 2.0, "question_set": "same"}

    monkeypatch.setattr(promotion, "evaluate_model", evaluate)
    monkeypatch.setattr(promote, "warm_started_model", lambda recipe, stages: state["warm"])
    stages = plan(state["recipe"], demo_home)
    state["promote"] = lambda version: promote.register_and_promote(state["recipe"], stages, version=version)
    state["versions"] = [str(register_model_folder(tiny_lm_path, NAME, tracking_uri=promote_store(demo_home)).version)
                         for _ in range(3)]
    return state


def promote_store(home: Path) -> str:
    return f"sqlite:///{home / 'mlflow.db'}"


def test_a_model_below_chance_is_not_promoted(promoting: dict, demo_home: Path) -> None:
    v1 = promoting["versions"][0]
    promoting["scores"][f"models:/{NAME}/{v1}"] = 0.0
    result = promoting["promote"](v1)
    assert not result.promoted and alias_version(NAME, "champion", promote_store(demo_home)) is None
    assert [b.score for b in result.bars] == [0.25]  # the val split's chance, from its records
    assert "not promoted to @champion: val accuracy/overall 0.0 % [0.0, 65.8] is not above chance 25.0 %" \
        in result.describe()
    # Chance at a tie is not beaten either.
    promoting["scores"][f"models:/{NAME}/{v1}"] = 0.25
    assert not promoting["promote"](v1).promoted


@pytest.mark.parametrize("warm, why", [
    # Above chance and the warm start, but with an interval that reaches down past chance:
    # too few questions to call it better than a guess.
    (0.4, "; the low end of its 95 % interval (9.5 %) is not above chance 25.0 %"),
    (0.75, " is not above the warm-started policy's 75.0 %; the low end of its 95 % interval (9.5 %) is not "
           "above chance 25.0 %"),
])
def test_a_model_short_of_a_bar_is_not_promoted_and_says_which(promoting: dict, demo_home: Path, warm: float,
                                                                why: str) -> None:
    v1 = promoting["versions"][0]
    promoting["warm"] = "/warm/model"
    promoting["scores"].update({f"models:/{NAME}/{v1}": 0.5, "/warm/model": warm})
    result = promoting["promote"](v1)
    assert not result.promoted and alias_version(NAME, "champion", promote_store(demo_home)) is None
    assert result.describe().endswith("val accuracy/overall 50.0 % [9.5, 90.5]" + why)
    # The warm start is scored as the candidate is: on the validation split.
    assert ("/warm/model", "val") in promoting["asked"]
    assert not any(ref == "/warm/model" and split != "val" for ref, split in promoting["asked"])


def test_a_model_above_chance_and_the_warm_start_is_promoted(promoting: dict, demo_home: Path) -> None:
    from mlflow import MlflowClient

    v1, v2, v3 = promoting["versions"]
    promoting["warm"] = "/warm/model"
    # Two validation questions: 0.9 puts the low end of the 95 % interval just above chance.
    promoting["scores"].update({f"models:/{NAME}/{v1}": 0.9, f"models:/{NAME}/{v2}": 1.0,
                                f"models:/{NAME}/{v3}": 1.0, "/warm/model": 0.4})
    result = promoting["promote"](v1)
    store = promote_store(demo_home)
    assert result.promoted and str(alias_version(NAME, "champion", store).version) == v1
    assert "above chance 25.0 % and the warm-started policy's 40.0 % (no current champion): promoted" \
        in result.describe()
    description = MlflowClient(tracking_uri=store, registry_uri=store).get_model_version(NAME, v1).description
    assert ("accuracy/overall on the val split (2 questions): 90.0 % [27.9, 99.5]; chance 25.0 %, "
            "the warm-started policy's 40.0 %") in description
    assert "accuracy/overall on the test split (2 questions): 50.0 % [9.5, 90.5]; chance 25.0 %" in description
    # Above the bars, a champion must still be beaten; a tie keeps it.
    assert promoting["promote"](v2).promoted
    tie = promoting["promote"](v3)
    assert not tie.promoted and tie.champion_version == v2
    assert str(alias_version(NAME, "champion", store).version) == v2


def test_promotion_refuses_scores_on_different_questions(promoting: dict) -> None:
    from embodied_r.evaluation import promotion

    v1 = promoting["versions"][0]
    promoting["warm"] = "/warm/model"
    promoting["scores"].update({f"models:/{NAME}/{v1}": 0.5, "/warm/model": 0.4})
    evaluate = promotion.evaluate_model

    def lost_calls(ref, split, **where):  # noqa: ANN001
        out, summary = evaluate(ref, split, **where)
        return out, {**summary, "question_set": "fewer" if ref == "/warm/model" else "same"}

    promotion.evaluate_model = lost_calls
    with pytest.raises(ValueError, match="different question sets"):
        promoting["promote"](v1)


def test_commands_evaluate_register_and_promote(demo_home: Path, tiny_lm_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow import MlflowClient

    from embodied_r.apps.cli_eval import main

    quick = ["--recipe", "smoke", "--set", "evaluation.backend.max_new_tokens=6"]
    assert main(["eval-model", "tiny:lm", "--split", "val", *quick]) == 0
    out = capsys.readouterr().out
    assert "tiny:lm on the val split: overall 0.0 % [0.0, 65.8]" in out and "(2 answered, 0 failed)" in out
    store = f"sqlite:///{demo_home / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    run = client.search_runs([client.get_experiment_by_name("embodied-r").experiment_id])[0]
    assert run.data.tags["stage"] == "eval-model" and run.data.metrics["eval/count/overall"] == 2.0
    # The 95 % interval's bounds are logged beside the accuracy (Wilson's for 0 of 2).
    assert run.data.metrics["accuracy/overall_ci_low"] == 0.0
    assert round(run.data.metrics["accuracy/overall_ci_high"], 3) == 0.658
    assert {"report.md", "accuracy_by_task.png", "paper_comparison.csv", "metrics.json"} <= \
        {a.path for a in client.list_artifacts(run.info.run_id)}

    assert main(["register-model", str(tiny_lm_path), *quick]) == 0
    assert "as embodied-r-reasoner version 1" in capsys.readouterr().out
    # The random tiny model answers nothing right: below chance, it is not promoted even with
    # no champion to beat (the smoke recipe has no warm start: chance is the only bar).
    assert main(["promote", "--version", "1", *quick]) == 0
    assert ("embodied-r-reasoner v1 not promoted to @champion: val accuracy/overall 0.0 % [0.0, 65.8] "
            "is not above chance 25.0 %") in capsys.readouterr().out
    assert alias_version(NAME, "champion", store) is None
    # Its description gives its validation and test scores beside chance.
    description = client.get_model_version(NAME, "1").description
    assert "accuracy/overall on the val split (2 questions): 0.0 % [0.0, 65.8]; chance 25.0 %" in description
    assert "accuracy/overall on the test split (3 questions): 0.0 % [0.0, 56.2]; chance 25.0 %" in description
    assert "not promoted to @champion" in description
    assert main(["register-model", str(tiny_lm_path), "--alias", "champion", *quick]) == 0
    assert main(["eval-model", "models:/embodied-r-reasoner@champion", "--no-track", *quick]) == 0
    assert "on the test split" in capsys.readouterr().out
    assert main(["baselines", "--only", "policy", "--no-track", "--report", str(demo_home / "cmp.md"), *quick]) == 0
    assert "| **untrained reasoning model** | 0.0 | 0.0 |" in (demo_home / "cmp.md").read_text()

    assert main(["eval-model", "tiny:lm", "--recipe", "smoke", "--set", "records.choice_instruction=Answer."]) == 2
    assert "embodied-r convert --recipe smoke" in capsys.readouterr().err  # other records: not converted
