"""A stage's code key follows the code that stage runs, for the recipe that runs it: every
stage of every shipped recipe of both pipelines, planned with real source changes planted in
the library (a change is hashed as it would be read from disk, ``code_keys.source_version``)."""

from __future__ import annotations

import ast
import functools
import importlib
import shutil
from pathlib import Path

import pytest

from embodied_r import code_keys
from embodied_r.config import available_recipes, load_recipe
from embodied_r.config import REASONER_RECIPES, load_reasoner
from embodied_r.pipeline import plan
from embodied_r.code_keys import PACKAGE, ROOT, source_version, stage_modules
from embodied_r.stage_kinds import kind_of
from tests.test_architecture import library_modules

EMBODIED_R = {name: load_recipe(name) for name in available_recipes()}
REASONER = {p.stem: load_reasoner(p.stem) for p in sorted(REASONER_RECIPES.glob("*.yaml"))}
# The trainer machinery Embodied-Reasoner shares with Embodied-R (``interactive/__init__.py``):
# the child process, its entry and arguments, step lines and the figures of a run.
SHARED_TRAINER = {f"{PACKAGE}.training{m}" for m in ("", ".environment", ".multinode", ".child", ".callbacks",
                                                      ".learning", ".trl_args", ".sft_run", ".sft_child",
                                                      ".checkpoints", ".disk", ".grpo_settings", ".sft_settings")}
METHOD = ("data", "synthetic", "keyframes", "perception", "scoring", "evaluation", "training")


def package_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def all_plans(home: Path, recipes: set[str] | None = None) -> dict[str, dict]:
    """Every shipped recipe's plan (or those named)."""
    plans = {name: plan(r, home) for name, r in EMBODIED_R.items() if recipes is None or name in recipes}
    plans.update({name: plan(r, home) for name, r in REASONER.items() if recipes is None or name in recipes})
    return plans


def keys(home: Path, recipes: set[str] | None = None) -> dict[tuple[str, str], str]:
    return {(recipe, name): sp.key for recipe, stages in all_plans(home, recipes).items()
            for name, sp in stages.items()}


def _source(module: str) -> str:
    return code_keys._source(module).read_text()


class _Planted(ast.NodeTransformer):
    """``print("planted")`` at the top of the body of the functions and classes named (of every
    function with ``None``)."""

    def __init__(self, names: set[str] | None):
        self.names = names

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.ClassDef) -> ast.AST:
        self.generic_visit(node)
        if node.name in (self.names or ()) or (self.names is None and not isinstance(node, ast.ClassDef)):
            at = 1 if ast.get_docstring(node, clean=False) is not None else 0
            node.body.insert(at, ast.parse('print("planted")').body[0])
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef


def planted(module: str, names: set[str] | None = None) -> str:
    """``module``'s source with a real change in the functions or classes named (every
    function with ``None``); a module without functions gets a statement of its own."""
    tree = _Planted(names).visit(ast.parse(_source(module)))
    if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree)):
        tree.body.append(ast.parse("_planted = 1").body[0])
    return ast.unparse(tree)


@pytest.fixture
def moved(tmp_path, monkeypatch):
    """``moved(changes)``: the (recipe, stage) pairs whose key moves when the modules given as
    ``{module: new source}`` hold that source."""
    base = keys(tmp_path)
    real = code_keys.module_version

    def run(changes: dict[str, str], recipes: set[str] | None = None) -> set[tuple[str, str]]:
        versions = {m: source_version(text) for m, text in changes.items()}
        monkeypatch.setattr(code_keys, "module_version", lambda name: versions.get(
            name if name.startswith(PACKAGE) else f"{PACKAGE}.{name}") or real(name))
        try:
            return {k for k, v in keys(tmp_path, recipes).items() if base[k] != v}
        finally:
            monkeypatch.setattr(code_keys, "module_version", real)

    return run


def _docs_and_comments_changed(source: str) -> str:
    """The same code with every docstring replaced or added, a comment after every line and
    the layout of ``ast.unparse``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.Expr(ast.Constant("Said otherwise."))
            if ast.get_docstring(node, clean=False) is not None:
                node.body[0] = doc
            else:
                node.body.insert(0, doc)
    lines = ast.unparse(tree).splitlines()
    return "# A comment line.\n" + "".join(f"{line}  # a comment\n\n" for line in lines)


def test_no_comment_docstring_or_layout_moves_a_key(tmp_path, monkeypatch):
    """The whole library rewritten on disk (comments, docstrings, layout) keys every stage of
    every recipe as before."""
    base = keys(tmp_path / "home")
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", "recipes"))
    for path in copy.rglob("*.py"):
        path.write_text(_docs_and_comments_changed(path.read_text()))
    versions = {m: code_keys.module_version(m) for m in library_modules()}
    monkeypatch.setattr(code_keys, "ROOT", copy)
    code_keys.reread()
    try:
        assert (copy / "io.py").read_text() != (ROOT / "io.py").read_text()
        assert [m for m in versions if code_keys.module_version(m) != versions[m]] == []
        assert keys(tmp_path / "home") == base
    finally:
        monkeypatch.undo()
        code_keys.reread()


def test_a_real_change_in_any_module_moves_its_version():
    """In every module, its last constant that is no docstring changed (a function planted where
    it has none): the kind of edit a comment-blind hash could miss."""
    same = []
    for module in library_modules():
        tree = ast.parse(_source(module))
        docstrings = code_keys._docstrings(tree)
        constants = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) in (int, str)
                     and id(n) not in docstrings]
        if not constants:
            changed = planted(module)
        else:
            constants[-1].value = constants[-1].value + 1 if isinstance(constants[-1].value, int) else "planted"
            changed = ast.unparse(tree)
        if source_version(changed) == code_keys.module_version(module):
            same.append(module)
    assert not same, same


def test_the_accuracy_reward_keys_training_and_evaluation_only(moved):
    hit = moved({f"{PACKAGE}.scoring.rewards": planted(f"{PACKAGE}.scoring.rewards", {"make_accuracy_reward"})})
    plans = all_plans(Path("/h"))
    for recipe in EMBODIED_R:
        stages = {name for r, name in hit if r == recipe}
        assert {n for n, sp in plans[recipe].items() if sp.kind in ("train", "evaluate")} <= stages, recipe
        # Promotion follows the evaluation it reads.
        assert {plans[recipe][n].kind for n in stages} <= {"warmstart", "train", "evaluate", "promote"}, (recipe, stages)
    assert not {r for r, _ in hit} & set(REASONER)


def test_the_perception_parser_keys_perception_and_what_follows(moved):
    hit = moved({f"{PACKAGE}.perception.parse": planted(f"{PACKAGE}.perception.parse")})
    plans = all_plans(Path("/h"))
    for recipe in EMBODIED_R:
        assert [n for n in plans[recipe] if (recipe, n) in hit] == plans[recipe].downstream(["perception"]), recipe
    assert not {r for r, _ in hit} & set(REASONER)


def _owned(module: str) -> str | None:
    """The pipeline whose code ``module`` is alone: None for what both share."""
    if package_of(module) == "interactive":
        return "embodied-reasoner"
    if package_of(module) in METHOD and module not in SHARED_TRAINER:
        return "embodied-r"
    return None


def test_one_pipelines_code_keys_no_stage_of_the_other(moved):
    """A real change in a module of one pipeline moves no key of the other's recipes (and the
    runners' own modules do move their pipeline's: the check sees what it plants)."""
    own = {"embodied-r": set(EMBODIED_R), "embodied-reasoner": set(REASONER)}
    crossing = []
    for module in library_modules():
        if (pipeline := _owned(module)) is not None:
            other = (set(EMBODIED_R) | set(REASONER)) - own[pipeline]
            crossing += [f"{module} -> {r}/{s}" for r, s in sorted(moved({module: planted(module)}, other))]
    assert not crossing, "one pipeline's code in the other's keys:\n" + "\n".join(crossing)
    plans = all_plans(Path("/h"))
    for pipeline, recipes in own.items():
        stage_runners = {kind_of(sp.kind).runner.split(":")[0] for r in recipes for sp in plans[r].values()}
        assert {r for r, _ in moved({m: planted(m) for m in stage_runners})} == recipes


def test_the_demo_code_keys_only_the_recipes_that_name_it(moved):
    plans = all_plans(Path("/h"))

    def demo_modules(recipe: str, stage: str) -> set[str]:
        sp = plans[recipe][stage]
        return {m for m in stage_modules(kind_of(sp.kind).runner, sp.config, sp.inputs) if package_of(m) == "demo"}

    assert all(not demo_modules("paper", s) for s in plans["paper"])
    assert all(not demo_modules("reasoner-paper", s) for s in plans["reasoner-paper"])
    demo = f"{PACKAGE}.demo"
    assert demo_modules("demo", "perception") == {demo, f"{demo}.world_perceiver"}  # kind: world
    assert demo_modules("smoke", "perception") == {demo, f"{demo}.models", f"{demo}.tiny_models"}  # tiny:vlm
    # The Embodied-Reasoner agent's builder keys the stage that builds it, and nothing of Embodied-R.
    builder = f"{demo}.tiny_vlm_reasoner"
    hit = moved({builder: planted(builder)})
    assert {r for r, _ in hit} == {"reasoner-demo"}
    assert ("reasoner-demo", "reasoner_sft_imitation") in hit


def test_a_synthetic_twin_keys_only_the_stages_whose_config_says_synthetic():
    twins = {f"{PACKAGE}.synthetic.urban", f"{PACKAGE}.synthetic.vsi"}
    keyed = {(r, sp.name) for r in ("smoke", "paper") for sp in all_plans(Path("/h"))[r].values()
             if twins <= set(stage_modules(kind_of(sp.kind).runner, sp.config, sp.inputs))}
    assert keyed == {("smoke", "download")}  # source: synthetic there, hub in the paper's


@functools.lru_cache(maxsize=None)
def _tree(module: str) -> ast.Module:
    return ast.parse(_source(module))


@functools.lru_cache(maxsize=None)
def _callees(module: str, function: str, depth: int = 1) -> frozenset[tuple[str, str]]:
    """``(module, name)``: the function or class ``module.function``, the library functions and
    classes its body calls by a name its module imported or defined, and theirs (``depth``
    calls deep); ``(module, "*")`` for a module it starts by name (a trainer child)."""
    tree = _tree(module)
    bound = {n.name: module for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            bound.update({a.asname or a.name: node.module for a in node.names})
    body = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == function)
    found = {(module, function)}
    for node in ast.walk(body):
        named = code_keys.named_module(node.value) if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
        if named and code_keys._source(named):
            # A module started by name runs whole; a ``module:function`` hook runs that function.
            found.add((named, node.value.partition(":")[2] or "*"))
        name = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
        if code_keys._source(bound.get(name, "")) and any(
                isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name for n in _tree(bound[name]).body):
            found |= _callees(bound[name], name, depth - 1) if depth else {(bound[name], name)}
    return frozenset(found)


def _by_name(words: set[str]) -> set[tuple[str, str]]:
    """The code the backends reach for these words, read from their tables as they resolve
    them: a backend kind, a ``tiny:`` reference, its builder."""
    backends = importlib.import_module(f"{PACKAGE}.backends.registry").BY_NAME
    models = importlib.import_module(f"{PACKAGE}.backends.models").BY_NAME
    demo = importlib.import_module(f"{PACKAGE}.demo.models").BY_NAME
    found = [backends[w].target for w in words if w in backends]
    found += [target for w in words for prefix, target in models.items() if w.startswith(prefix)]
    found += [demo[w] for w in words if w in demo]
    return {tuple(t.split(":")) for t in found}


def _walk_strings(value) -> set[str]:
    if isinstance(value, str):
        return {value}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return set().union(*(_walk_strings(v) for v in items)) if items else set()


def test_never_stale_a_change_in_a_function_a_stage_runs_moves_its_key(moved):
    """Every stage of every recipe: its runner, what the runner calls, the trainer child it
    starts, and the code its config names (a backend kind, a tiny model and its builder),
    changed one module at a time."""
    plans = all_plans(Path("/h"))
    runs: dict[str, set[tuple[str, str]]] = {}
    names: dict[str, set[str] | None] = {}
    for recipe, stages in plans.items():
        for name, sp in stages.items():
            words = _walk_strings(sp.config) | _walk_strings(sp.inputs)
            for module, function in _callees(*kind_of(sp.kind).runner.split(":")) | _by_name(words):
                runs.setdefault(module, set()).add((recipe, name))
                every = function == "*" or names.get(module, set()) is None
                names[module] = None if every else names.get(module, set()) | {function}
    assert {f"{PACKAGE}.demo.world_perceiver", f"{PACKAGE}.demo.tiny_reasoner", f"{PACKAGE}.training.grpo",
            f"{PACKAGE}.interactive.sft_data", f"{PACKAGE}.perception.stage"} <= set(runs)
    stale = []
    for module, stages in sorted(runs.items()):
        missed = stages - moved({module: planted(module, names[module])}, {r for r, _ in stages})
        stale += [f"{module} ({', '.join(sorted(names[module] or ['*']))}) does not key {r}/{s}"
                  for r, s in sorted(missed)]
    assert not stale, "\n".join(stale)


def test_plan_lists_the_modules_in_a_stage_key(capsys):
    from embodied_r.apps.cli import main

    assert main(["plan", "--recipe", "paper", "--modules", "perception"]) == 0
    lines = capsys.readouterr().out.splitlines()
    sp = plan(EMBODIED_R["paper"])["perception"]
    assert lines == [f"perception     to do    {sp.out}"] + [f"    {m}" for m in stage_modules(kind_of(sp.kind).runner, sp.config, sp.inputs)]
    listed = {line.strip() for line in lines[1:]}
    assert f"{PACKAGE}.perception.parse" in listed
    assert not {m for m in listed if package_of(m) in ("interactive", "demo", "training")}
