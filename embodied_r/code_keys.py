"""Each stage's code key: the digest, less docstrings, of every library module its runner reaches
for its config and inputs (imports, modules named in strings, the ``BY_NAME`` entries its words
pick), kept on disk by file size and mtime; and a runner (``module:function``) resolved by name."""

from __future__ import annotations

import ast
import gc
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, NamedTuple

from embodied_r.paths import home

PACKAGE = "embodied_r"
# A stage kind's declaration: how it is scheduled and described, not what it computes.
DECLARATION = "StageKind"
TABLE = "BY_NAME"

# A runner takes the stage folder, the stage's config, its named inputs (paths or model
# references) and the MLflow run it may log into, and returns the stage's summary.
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


# CPython before 3.11.8 shares the AST constructor's recursion depth between threads (gh-106905):
# a GC finalizer can hand the GIL to a thread that parses too, and the parse raises "recursion
# depth mismatch". With collection held off (under a lock of ours) no other thread runs meanwhile.
_PARSE_LOCK = threading.Lock()


def _parse(source: str, filename: str = "<unknown>") -> ast.Module:
    with _PARSE_LOCK:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(source, filename)
        finally:
            if collecting:
                gc.enable()


class _Facts(NamedTuple):
    """What the code keys read of one source file: its digest, the library modules it may
    import or name (kept whether or not they exist, which other files decide) and its table."""

    digest: str
    imports: tuple[str, ...]
    names: tuple[str, ...]
    table: tuple[tuple[str, str], ...]
    table_error: str | None


# Facts are kept on disk by file path, size and mtime_ns, one file per Python release and per
# version of this module, so a plan on unchanged code parses nothing.
_CACHE_FORMAT = 1
_disk: dict[str, list] | None = None
_dirty = False


def _cache_file() -> Path:
    return home() / "cache" / "code-keys" / f"{sys.implementation.cache_tag}.json"


@lru_cache(maxsize=None)
def _analyser() -> str:
    return hashlib.sha256(f"{_CACHE_FORMAT}:".encode() + Path(__file__).read_bytes()).hexdigest()[:16]


def _cached() -> dict[str, list]:
    global _disk
    if _disk is None:
        try:
            held = json.loads(_cache_file().read_text())
            _disk = held["files"] if held.get("analyser") == _analyser() else {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            _disk = {}
    return _disk


def _flush() -> None:
    """Write the facts read fresh since the last write (a home that cannot be written keeps no
    cache: the keys are the same, only slower to get)."""
    global _dirty
    if not _dirty:
        return
    _dirty = False
    files = {path: entry for path, entry in _cached().items() if os.path.exists(path)}
    target = _cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"analyser": _analyser(), "files": files}))
        os.replace(tmp, target)
    except OSError:
        pass


def _read(module: str, path: Path, tree: ast.Module) -> _Facts:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    imports: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # ``from pkg import mod`` imports a module; ``from mod import name`` does not.
            imports.update([base] + [f"{base}.{alias.name}" for alias in node.names])
    table = _table(tree)
    skipped = _docstrings(tree) | {id(n) for top in [table, *_declarations(tree)] if top for n in ast.walk(top)}
    names = {name for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and id(node) not in skipped and (name := named_module(node.value))}
    try:
        entries, error = _entries(module, tree, table), None
    except ValueError as exc:
        entries, error = (), str(exc)
    ours = sorted(n for n in imports if n == PACKAGE or n.startswith(PACKAGE + "."))
    return _Facts(_digest(tree), tuple(ours), tuple(sorted(names)), entries, error)


@lru_cache(maxsize=None)
def _facts(module: str) -> _Facts | None:
    global _dirty
    path = _source(module)
    if path is None:
        return None
    stat = path.stat()
    held = _cached().get(str(path))
    if held is not None and held[:2] == [stat.st_size, stat.st_mtime_ns]:
        digest, imports, names, table, error = held[2:]
        return _Facts(digest, tuple(imports), tuple(names), tuple(map(tuple, table)), error)
    facts = _read(module, path, _parse(path.read_text(), str(path)))
    _cached()[str(path)] = [stat.st_size, stat.st_mtime_ns, *facts]
    _dirty = True
    return facts


def reread() -> None:
    """Forget every source read, as after the library's files changed on disk."""
    global _disk, _dirty
    _flush()
    _disk, _dirty = None, False
    for cached in (_source, _facts, imports_of, launches_of, tables_of, closure, module_version):
        cached.cache_clear()


@lru_cache(maxsize=None)
def imports_of(module: str) -> frozenset[str]:
    """The library modules ``module`` imports itself, anywhere in its source."""
    facts = _facts(module)
    if facts is None:
        return frozenset()
    found = {name for name in facts.imports if _is_module(name)}
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


def _entries(module: str, tree: ast.Module, table: ast.Dict | None) -> tuple[tuple[str, str], ...]:
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
def tables_of(module: str) -> tuple[tuple[str, str], ...]:
    """``(word, module)`` for each entry of ``module``'s ``BY_NAME`` table: the code a word of a
    recipe runs. A key may be a module-level name bound to a string (``TINY_PREFIX``)."""
    facts = _facts(module)
    if facts is None:
        return ()
    if facts.table_error:
        raise ValueError(facts.table_error)
    return facts.table


@lru_cache(maxsize=None)
def launches_of(module: str) -> frozenset[str]:
    """The library modules ``module`` names in a string (a trainer child it starts with ``python -m``,
    a module it runs by name): they run as surely as an import. Its ``BY_NAME`` entries run only
    where a recipe says their word (``closure``), and each stage starts from its own kind's runner."""
    facts = _facts(module)
    if facts is None:
        return frozenset()
    return frozenset(name for name in facts.names if name != module and _is_module(name))


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
    ``BY_NAME`` entries whose word is among ``words`` (a word ending in ``:`` names every
    reference that starts with it), sorted."""
    seen = {module}
    todo = [module]
    while todo:
        current = todo.pop()
        named = {target for word, target in tables_of(current) if _says(words, word)}
        for dep in imports_of(current) | launches_of(current) | named:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    _flush()
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
    """The module's ``NAME = StageKind(...)`` statements: a declaration (runner, pool, retries, help)
    changes nothing a stage computes, so it joins no key (its inputs key the stage)."""
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
    facts = _facts(name)
    if facts is None:
        raise ValueError(f"no library module {name!r} to hash (moved or renamed? its name is kept "
                         "as a string somewhere)")
    return facts.digest


def modules_version(modules: tuple[str, ...] | list[str]) -> str:
    h = hashlib.sha256()
    for name in sorted(modules):
        h.update(f"{name}={module_version(name)}\n".encode())
    _flush()
    return h.hexdigest()


def stage_modules(runner: str, config: Any = None, inputs: Any = None) -> tuple[str, ...]:
    """The library modules a stage whose runner is ``runner`` ("module:function" or a module)
    runs with this config and these inputs."""
    return closure(runner.split(":")[0], said(config) | said(inputs))


def code_version(runner: str, config: Any = None, inputs: Any = None) -> str:
    return modules_version(stage_modules(runner, config, inputs))
