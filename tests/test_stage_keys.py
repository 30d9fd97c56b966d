"""What names a folder: the keyed-folder helper gives the values the hand-written hashes gave
(so no finished folder is orphaned), and every module name that the code hashes by string
exists (a moved module would otherwise drop out of a key unnoticed)."""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

from embodied_r import stage_plan
from embodied_r.evaluation.stage import question_set
from embodied_r.interactive.download import fingerprint
from embodied_r.io import KEY_HEX, keyed_folder, payload_key, text_key
from embodied_r.code_keys import PACKAGE, ROOT
from embodied_r.stage_kinds import KINDS, kind_of

# -- the helper keeps the keys the pipeline and the side caches had ------------------------


def test_a_stage_key_is_the_value_the_pipeline_computed_before(monkeypatch):
    # Computed by the stage key's own json.dumps + sha256 code before the helper existed.
    monkeypatch.setattr(stage_plan, "code_version", lambda kind, config, inputs: "c" * 64)
    config = {"fps": 1.0, "max": 32, "nested": {"b": [1, 2], "a": None}}
    assert stage_plan.stage_key(kind_of("keyframes"), config, ["0123456789abcdef"], "x") == "b1080c2ad3a35d15"


def test_side_cache_keys_are_the_values_they_were():
    assert question_set(["q2", "q1", "q10"]) == "fb9066e15a127aa6"  # the evaluation's question set
    # A value JSON cannot hold is keyed by its str, as the SFT baseline's folder was.
    assert payload_key({"b": 1, "a": [1, "x"], "p": Path("/tmp/x")}) == "044735abc86cb046"
    assert payload_key({"a": 1, "b": 2}) == payload_key({"b": 2, "a": 1})
    assert len(text_key(b"bytes")) == KEY_HEX == 16
    assert keyed_folder(Path("/r"), {"a": 1}) == Path("/r") / payload_key({"a": 1})


def test_a_local_mirror_keys_the_reasoner_data_stage_as_before(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.json").write_bytes(b"abc")
    (tmp_path / "sub" / "b.zip").write_bytes(b"12345")
    for name in ("a.json", "sub/b.zip"):
        os.utime(tmp_path / name, (1_700_000_000, 1_700_000_000))
    assert fingerprint({"data": {"source": "local", "source_dir": str(tmp_path)}}) == "cdb11ebd3aabac9c"


# -- every module name hashed by string exists ---------------------------------------------

# Functions that hash modules given by name, and those that hash a stage runner's modules.
MODULE_HASHERS = {"module_version", "modules_version", "closure"}
KIND_HASHERS = {"code_version", "stage_modules"}


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _strings(node: ast.AST, constants: dict[str, ast.AST]) -> list[str]:
    """Name-like strings in a call's argument, following names bound at module level to a
    tuple or list (``SFT_MODULES``); a subscript's key (``plan["kind"]``) names nothing."""
    out = []
    keys = {id(sub.slice) for sub in ast.walk(node) if isinstance(sub, ast.Subscript)}
    for sub in ast.walk(node):
        if id(sub) in keys:
            continue
        if isinstance(sub, ast.Name) and isinstance(constants.get(sub.id), (ast.Tuple, ast.List)):
            out += _strings(constants[sub.id], {})
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value and all(
                part.isidentifier() for part in sub.value.replace(":", ".").split(".")):
            out.append(sub.value)
    return out


def hashed_names() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(where, module)`` and ``(where, runner)`` for every string the code hashes."""
    modules, kinds = [], []
    sources = sorted(ROOT.rglob("*.py")) + sorted((ROOT.parent / "tasks").glob("*.py")) + sorted(
        (ROOT.parent / "flows").glob("*.py"))
    for path in sources:
        tree = ast.parse(path.read_text())
        constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                     for t in node.targets if isinstance(t, ast.Name)}
        where = str(path.relative_to(ROOT.parent))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (name := _call_name(node)) in MODULE_HASHERS | KIND_HASHERS:
                found = [s for arg in node.args for s in _strings(arg, constants)]
                (modules if name in MODULE_HASHERS else kinds).extend((where, s) for s in found)
    return modules, kinds


def test_every_module_the_code_hashes_by_name_imports():
    modules, kinds = hashed_names()
    names = {m if m.startswith(PACKAGE + ".") else f"{PACKAGE}.{m}" for _, m in modules}
    # The collector sees the evaluation folders' and the SFT baseline's names.
    assert {"embodied_r.evaluation.report", "embodied_r.training.sft"} <= names
    missing = []
    for where, module in modules:
        try:
            importlib.import_module(module if module.startswith(PACKAGE + ".") else f"{PACKAGE}.{module}")
        except ModuleNotFoundError as exc:
            missing.append(f"{where}: {module!r} ({exc})")
    for where, runner in kinds:
        try:
            importlib.import_module(runner.split(":")[0])
        except ModuleNotFoundError as exc:
            missing.append(f"{where}: runner {runner!r} ({exc})")
    assert not missing, "hashed names that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("target", sorted({k.runner for k in KINDS} | {k.extra_key for k in KINDS if k.extra_key}))
def test_every_stage_runner_named_in_the_table_imports(target):
    module, function = target.split(":")
    assert callable(getattr(importlib.import_module(module), function))
