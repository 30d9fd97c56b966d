"""The registry of stage runners, and each stage's code version.

The pipeline reaches a stage only through the table of stage kinds (``stage_kinds``): a kind
names the function that runs it, as ``module:function``, imported when the stage runs. No
stage package is imported to plan a run.

A runner takes ``(out, config, inputs, mlflow_run_id)``: the stage folder, the stage's own
config as a dict, its named inputs (paths or model references) and the MLflow run it may
log into; it returns the stage's summary.

A stage's code version hashes the source of every library module its runner imports,
directly or through other modules, at module level or inside a function, and of every
module it names in a string to start or import it (a trainer child, ``python -m MODULE``;
the demo's code, which the backends import by name: ``MODULE`` or ``MODULE:attribute``).
The set is read from the code's own imports, so a module that a stage starts using joins
its key without anyone keeping a list.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from embodied_r.stage_kinds import kind_of

PACKAGE = "embodied_r"

Runner = Callable[[Path, dict[str, Any], dict[str, str], "str | None"], dict[str, Any]]


def runner(kind: str) -> Runner:
    module, function = kind_of(kind).runner.split(":")
    return getattr(importlib.import_module(module), function)


ROOT = Path(__file__).resolve().parent


def extra_key(kind: str, config: dict[str, Any]) -> str:
    """What keys a stage beyond its config and code ("" for most stages)."""
    named = kind_of(kind).extra_key
    if named is None:
        return ""
    module, function = named.split(":")
    return getattr(importlib.import_module(module), function)(config)


@lru_cache(maxsize=None)
def _source(module: str) -> Path | None:
    """The file of a library module, found on disk: nothing is imported to hash a stage."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
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


def _parse(path: Path) -> ast.Module:
    with _PARSE_LOCK:
        return ast.parse(path.read_text(), str(path))


@lru_cache(maxsize=None)
def imports_of(module: str) -> frozenset[str]:
    """The library modules ``module`` imports itself, anywhere in its source."""
    path = _source(module)
    if path is None:
        return frozenset()
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(_parse(path)):
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
    found.update(".".join(parts[:i]) for i in range(1, len(parts)))
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


@lru_cache(maxsize=None)
def launches_of(module: str) -> frozenset[str]:
    """The library modules ``module`` names in a string: a trainer child it starts as
    ``python -m embodied_r.training.grpo``, or a class it imports by name as
    ``embodied_r.demo.world_perceiver:WorldPerceiver``, runs that module's code as surely as
    an import."""
    path = _source(module)
    if path is None:
        return frozenset()
    named = (named_module(node.value) for node in ast.walk(_parse(path))
             if isinstance(node, ast.Constant) and isinstance(node.value, str))
    return frozenset(name for name in named if name and name != module and _is_module(name))


@lru_cache(maxsize=None)
def closure(module: str) -> tuple[str, ...]:
    """``module`` and every library module it reaches through imports or launches, sorted."""
    seen = {module}
    todo = [module]
    while todo:
        current = todo.pop()
        for dep in imports_of(current) | launches_of(current):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return tuple(sorted(seen))


@lru_cache(maxsize=None)
def module_version(module: str) -> str:
    """sha256 of one module's source (``module`` dotted, with or without the package); a
    module that does not exist is an error, never a constant hash."""
    name = module if module.startswith(PACKAGE) else f"{PACKAGE}.{module}"
    path = _source(name)
    if path is None:
        raise ValueError(f"no library module {name!r} to hash (moved or renamed? its name is kept "
                         "as a string somewhere)")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def modules_version(modules: tuple[str, ...] | list[str]) -> str:
    h = hashlib.sha256()
    for name in sorted(modules):
        h.update(f"{name}={module_version(name)}\n".encode())
    return h.hexdigest()


def stage_modules(kind: str) -> tuple[str, ...]:
    """The library modules a stage kind runs."""
    return closure(kind_of(kind).runner.split(":")[0])


def code_version(kind: str) -> str:
    return modules_version(stage_modules(kind))

