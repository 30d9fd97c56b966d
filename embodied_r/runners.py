"""The registry of stage runners, and each stage's code version.

The pipeline reaches a stage only through the table of stage kinds (``stage_kinds``): a kind
names the function that runs it, as ``module:function``, imported when the stage runs. No
stage package is imported to plan a run.

A runner takes ``(out, config, inputs, mlflow_run_id)``: the stage folder, the stage's own
config as a dict, its named inputs (paths or model references) and the MLflow run it may
log into; it returns the stage's summary.

A stage's code version hashes every library module its runner runs for the stage's own
config and inputs: the modules it imports, directly or through other modules, at module
level or inside a function; those it names in a string to start or import (a trainer child,
``python -m MODULE``); and those the stage's config or inputs reach by a word, through a
module's ``BY_NAME`` table. Such a table is a dict literal of ``word: "module:attribute"``
(the backend ``kind: world``, the model reference ``tiny:lm``; a word ending in ``:`` names
every reference that starts with it), and its entries join a key only where the stage's
config or inputs say the word, so the demo's builders key only the stages that build them.
The set is read from the code, so a module that a stage starts using joins its key without
anyone keeping a list.

A module is hashed as its parse tree less its docstrings: comments, docstrings and layout
never move a key; any change to what the code does does.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

PACKAGE = "embodied_r"
# A stage kind's declaration: how it is scheduled and described, not what it computes.
DECLARATION = "StageKind"
TABLE = "BY_NAME"

Runner = Callable[[Path, dict[str, Any], dict[str, str], "str | None"], dict[str, Any]]


def runner(named: str) -> Runner:
    """The function a stage kind names as its runner (``module:function``), imported now."""
    module, function = named.split(":")
    return getattr(importlib.import_module(module), function)


ROOT = Path(__file__).resolve().parent


def extra_key(named: str | None, config: dict[str, Any]) -> str:
    """What keys a stage beyond its config and code: ``named`` ("module:function" of its
    config) called, or "" (most stages)."""
    if named is None:
        return ""
    module, function = named.split(":")
    return getattr(importlib.import_module(module), function)(config)


@lru_cache(maxsize=None)
def _source(module: str) -> Path | None:
    """The file of a library module, found on disk: nothing is imported to hash a stage. A
    module outside the library (a stage a user declares in a package of their own) is found
    where Python would import it from."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        return origin if origin is not None and origin.suffix == ".py" and origin.is_file() else None
    base = ROOT.joinpath(*module.split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_module(name: str) -> bool:
    return _source(name) is not None


# CPython 3.11's parser is not safe to enter from several threads at once (Prefect runs
# tasks and its own services in threads), so sources are parsed one at a time.
_PARSE_LOCK = threading.Lock()


def _parse(source: str, filename: str = "<unknown>") -> ast.Module:
    with _PARSE_LOCK:
        return ast.parse(source, filename)


@lru_cache(maxsize=None)
def _tree(module: str) -> ast.Module | None:
    path = _source(module)
    return None if path is None else _parse(path.read_text(), str(path))


def reread() -> None:
    """Forget every source read, as after the library's files changed on disk."""
    for cached in (_source, _tree, imports_of, launches_of, tables_of, closure, module_version):
        cached.cache_clear()


@lru_cache(maxsize=None)
def imports_of(module: str) -> frozenset[str]:
    """The library modules ``module`` imports itself, anywhere in its source."""
    tree = _tree(module)
    if tree is None:
        return frozenset()
    found: set[str] = set()
    package = module if _source(module).name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # ``from pkg import mod`` imports a module; ``from mod import name`` does not.
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if (name == PACKAGE or name.startswith(PACKAGE + ".")) and _is_module(name):
                found.add(name)
    # Importing a module runs its packages' __init__ files too.
    parts = module.split(".")
    found.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if _is_module(p))
    found.discard(module)
    return frozenset(found)


def named_module(text: str) -> str | None:
    """The library module a string names, as ``MODULE`` or ``MODULE:attribute`` (None for any
    other string; the module need not exist)."""
    name, _, attribute = text.partition(":")
    parts = name.split(".")
    if parts[0] != PACKAGE or len(parts) < 2 or not all(p.isidentifier() for p in parts):
        return None
    return name if not attribute or attribute.isidentifier() else None


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes in ``tree``."""
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and ast.get_docstring(node, clean=False) is not None}


def _table(tree: ast.Module) -> ast.Dict | None:
    return next((node.value for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                 and any(isinstance(t, ast.Name) and t.id == TABLE for t in node.targets)), None)


@lru_cache(maxsize=None)
def tables_of(module: str) -> tuple[tuple[str, str], ...]:
    """``(word, module)`` for each entry of ``module``'s ``BY_NAME`` table: the code a word of a
    recipe runs. A key may be a module-level name bound to a string (``TINY_PREFIX``)."""
    tree = _tree(module)
    table = _table(tree) if tree is not None else None
    if table is None:
        return ()
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) for t in node.targets if isinstance(t, ast.Name)}
    entries = []
    for key, value in zip(table.keys, table.values):
        word = constants.get(key.id) if isinstance(key, ast.Name) else getattr(key, "value", None)
        # An entry is the "module:attribute" string, or a call whose first argument is that
        # string (a registry row that also says what the thing is).
        if isinstance(value, ast.Call) and value.args:
            value = value.args[0]
        target = named_module(value.value) if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
        if not isinstance(word, str) or target is None:
            raise ValueError(f"{module}.{TABLE}: each entry must map a word to a 'module:attribute' string, "
                             "or to a call whose first argument is one")
        entries.append((word, target))
    return tuple(entries)


@lru_cache(maxsize=None)
def launches_of(module: str) -> frozenset[str]:
    """The library modules ``module`` names in a string: a trainer child it starts as
    ``python -m embodied_r.training.grpo``, or a module whose code it runs by name, runs that
    module's code as surely as an import. The entries of its ``BY_NAME`` table are not among
    them: those run only where a recipe says their word (``closure``). Nor are the stage
    table's: each stage runs its own kind's runner, from which its key starts."""
    tree = _tree(module)
    if tree is None:
        return frozenset()
    table = _table(tree)
    skipped = _docstrings(tree) | {id(n) for top in [table, *_declarations(tree)] if top for n in ast.walk(top)}
    named = (named_module(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped)
    return frozenset(name for name in named if name and name != module and _is_module(name))


def said(value: Any) -> frozenset[str]:
    """Every string in a stage's config or inputs: the words that may pick code from a
    ``BY_NAME`` table."""
    if isinstance(value, str):
        return frozenset([value])
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return frozenset().union(*map(said, items))


def _says(words: frozenset[str], word: str) -> bool:
    return word in words or (word.endswith(":") and any(w.startswith(word) for w in words))


@lru_cache(maxsize=None)
def closure(module: str, words: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """``module`` and every library module it reaches through imports, launches and the
    ``BY_NAME`` entries whose word is among ``words``, sorted."""
    seen = {module}
    todo = [module]
    while todo:
        current = todo.pop()
        named = {target for word, target in tables_of(current) if _says(words, word)}
        for dep in imports_of(current) | launches_of(current) | named:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return tuple(sorted(seen))


def _canonical(node: Any, docstrings: set[int]) -> str:
    """A parse tree as text, less docstrings and the fields a node leaves empty (so a Python
    release that adds an empty field to a node hashes the same code the same)."""
    if isinstance(node, list):
        return "[" + ",".join(_canonical(n, docstrings) for n in node
                              if not (isinstance(n, ast.Expr) and id(n.value) in docstrings)) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = (f"{name}={_canonical(value, docstrings)}" for name, value in ast.iter_fields(node)
              if value is not None and not (isinstance(value, list) and not value))
    return f"{type(node).__name__}({','.join(fields)})"


def _declarations(tree: ast.Module) -> list[ast.stmt]:
    """The module's ``NAME = StageKind(...)`` statements: a stage kind's declaration names its
    runner and sets its pool, retries and help, none of which changes what a stage computes, so
    neither its strings nor its edits join a key (what it reads keys the stage as its inputs)."""
    return [node for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", getattr(node.value.func, "attr", "")) == DECLARATION]


def _digest(tree: ast.Module) -> str:
    kept = ast.Module(body=[n for n in tree.body if n not in _declarations(tree)], type_ignores=[])
    return hashlib.sha256(_canonical(kept, _docstrings(tree)).encode()).hexdigest()


def source_version(source: str) -> str:
    """sha256 of a module's code given as its source text."""
    return _digest(_parse(source))


@lru_cache(maxsize=None)
def module_version(module: str) -> str:
    """sha256 of one module's code (``module`` dotted, with or without the package); a module
    that does not exist is an error, never a constant hash."""
    name = module if module.startswith(PACKAGE) or _source(module) else f"{PACKAGE}.{module}"
    tree = _tree(name)
    if tree is None:
        raise ValueError(f"no library module {name!r} to hash (moved or renamed? its name is kept "
                         "as a string somewhere)")
    return _digest(tree)


def modules_version(modules: tuple[str, ...] | list[str]) -> str:
    h = hashlib.sha256()
    for name in sorted(modules):
        h.update(f"{name}={module_version(name)}\n".encode())
    return h.hexdigest()


def stage_modules(runner: str, config: Any = None, inputs: Any = None) -> tuple[str, ...]:
    """The library modules a stage whose runner is ``runner`` ("module:function" or a module)
    runs with this config and these inputs."""
    return closure(runner.split(":")[0], said(config) | said(inputs))


def code_version(runner: str, config: Any = None, inputs: Any = None) -> str:
    return modules_version(stage_modules(runner, config, inputs))
