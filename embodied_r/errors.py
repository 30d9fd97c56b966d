"""The project's errors, each saying its kind, whether a retry of its stage may get past it, the
command's exit status and its one line; ``may_pass`` says it of any error, a library's too.
Imports nothing of the library."""

from __future__ import annotations

from typing import Any, ClassVar, Iterator, Literal

# One item's bad input, an outage of a service, a setting to change, or the machine (its disk,
# its files, another run).
Kind = Literal["item", "infra", "config", "environment"]


class ProjectError(Exception):
    """One of ours: ``class X(ProjectError, kind=..., may_pass=..., status=...)``; what a class
    does not say it inherits. Its message names the thing and the fix."""

    kind: ClassVar[Kind]
    may_pass: ClassVar[bool] = False
    status: ClassVar[int] = 1

    def __init_subclass__(cls, kind: Kind | None = None, may_pass: bool | None = None, status: int | None = None,
                          **rest: Any) -> None:
        super().__init_subclass__(**rest)
        for name, value in (("kind", kind), ("may_pass", may_pass), ("status", status)):
            if value is not None:
                setattr(cls, name, value)

    def line(self) -> str:  # what the user reads of it
        return str(self)


# -- a stage stopped before its end: its partial folder is kept for the rerun -----------------
class StageFault(ProjectError, RuntimeError, kind="infra"):
    """A stage stopped on purpose; no retry of it gets past the cause."""


class InfraFailure(StageFault):
    """A service the stage depends on failed after its retries."""


class TooManyFailures(StageFault, kind="item"):
    """More items failed than the recipe's ``max_failed_fraction`` allows."""


class WriteFailure(StageFault, kind="environment"):
    """A finished item could not be written (a full disk, a read-only folder): work would be lost."""


class DiskFull(StageFault, kind="environment"):
    """A disk filled under a stage or a store; the message names the folder, what is free and the fix."""


class DamagedOutput(StageFault, kind="environment"):
    """A finished stage folder no longer holds what it held when its stage finished."""


class WorldPerceiverError(StageFault, ValueError, kind="config"):
    """A source or call the demo's stand-in perceiver cannot serve: a setting to change."""


DEFAULT_MAX_FAILED_FRACTION = 0.05


def check_failed_fraction(stage: str, failed: int, total: int, limit: float, detail: str = "") -> None:
    """Raise :class:`TooManyFailures` when ``failed / total`` exceeds ``limit``."""
    if total and failed / total > limit:
        raise TooManyFailures(
            f"{stage}: {failed} of {total} items failed ({failed / total:.1%}), above the recipe's "
            f"max_failed_fraction {limit:g}{'; ' + detail if detail else ''}. The work done is kept in the "
            f"stage's .partial folder: fix the cause and run again to redo only the failed items, "
            f"or raise {stage}.max_failed_fraction (the same folder resumes)"
        )


# -- the machine ------------------------------------------------------------------------------
class StageBusy(ProjectError, RuntimeError, kind="environment"):
    """Another run holds this stage's lock and the caller asked not to wait."""


class HomeMovedError(ProjectError, RuntimeError, kind="environment", status=2):
    """The home was created elsewhere; the message says how to relocate it."""


class HomeUnusable(ProjectError, RuntimeError, kind="environment", status=2):
    """The project home cannot be created or written; the message names it as the home."""


class DiskSpaceError(ProjectError, RuntimeError, kind="environment"):
    """Too little free disk for a stage's checkpoints; the message names the knobs."""


class SmolNotFetched(ProjectError, FileNotFoundError, kind="environment"):
    """SmolLM2 is not in the home's models yet; the message names the command that fetches it."""


# A retry may get past these: an install, a download or a service may come meanwhile.
class BackendUnavailable(ProjectError, RuntimeError, kind="environment", may_pass=True):
    """The backend's packages are not installed in this environment."""


class EmbeddingModelMissing(ProjectError, RuntimeError, kind="environment", may_pass=True):
    """The embedding model is neither a local folder nor in the cache."""


class AI2ThorUnavailable(ProjectError, RuntimeError, kind="environment", may_pass=True):
    """ai2thor is not installed, or its build cannot start here (no GPU, no Vulkan)."""


class SyncMismatch(ProjectError, RuntimeError, kind="environment", may_pass=True):
    """The engine's log-probabilities of the probe differ from the policy's beyond the tolerance."""


# -- outages ----------------------------------------------------------------------------------
class TrackingUnavailable(ProjectError, RuntimeError, kind="infra", status=2):
    """The tracking store a run names does not answer."""


class TrackingLost(TrackingUnavailable):
    """The tracking store stopped answering during a run: later calls are skipped."""


class GenerationUnavailable(ProjectError, RuntimeError, kind="infra", may_pass=True):
    """The model service failed for a reason that is not the item's (``error_kind`` infra)."""


class StageRunFailed(ProjectError, RuntimeError, kind="infra", may_pass=True):
    """A stage's flow run, sent to a work pool, did not complete."""


class ShardRunFailed(StageRunFailed):
    """A shard's flow run, sent to the stage's work pool, did not complete."""


# -- settings ---------------------------------------------------------------------------------
class RecipeError(ProjectError, ValueError, kind="config", status=2):
    """A recipe that cannot be found or does not validate."""


class StageError(ProjectError, ValueError, kind="config", status=2):
    """An unknown stage, or a stage asked for before the stages it reads from."""


class PromptsError(ProjectError, ValueError, kind="config", status=2):
    """A checkout, a prompts file or a text that cannot be used."""


class RegistryError(ProjectError, ValueError, kind="config"):
    """A registry URI, model or alias that does not exist."""


class PadTokenError(ProjectError, ValueError, kind="config"):
    """A model folder whose pad token the chat template writes."""


class PosesError(ProjectError, ValueError, kind="config"):
    """The hand-made poses file is missing or not in the original's shape."""


# -- bad input --------------------------------------------------------------------------------
class DataSourceError(ProjectError, ValueError, kind="item", status=2):
    """A dataset source that is missing, unreachable or malformed."""


class CatalogError(ProjectError, ValueError, kind="item", status=2):
    """A source file without the benchmark's schema, or a task the source does not have."""


class DatasetError(ProjectError, ValueError, kind="item"):
    """The Embodied-Reasoner dataset's files are missing or do not follow the layout."""


class TestCaseError(ProjectError, ValueError, kind="item"):
    """A test-case file that does not follow the benchmark's layout."""


class InferenceInputError(ProjectError, ValueError, kind="item"):
    """The input file is not a list of records in the expected format."""


class VideoError(ProjectError, kind="item"):
    """A video that cannot be used; ``code`` is a short reason for counting failures."""

    def __init__(self, code: str, path: Any, detail: str):
        self.code = code
        self.path = str(path)
        super().__init__(f"{code}: {path}: {detail}")


# -- what a retry cannot get past ---------------------------------------------------------------

# Library errors by class (module and name, matched along the bases), so that nothing is
# imported to name them: a value refused (pydantic's ValidationError is a ValueError), an input
# missing or of the wrong type, a damaged Parquet file or archive.
FINAL = frozenset({"builtins.ValueError", "builtins.FileNotFoundError", "builtins.PermissionError",
                   "builtins.IsADirectoryError", "builtins.NotADirectoryError", "pyarrow.lib.ArrowInvalid",
                   "zipfile.BadZipFile"})

# errno values that mean "no room": ENOSPC, and EDQUOT (a quota is a full disk to the user).
_NO_ROOM = {28, 122}
_READ_ONLY = 30  # EROFS
# SQLite's SQLITE_FULL as its Python driver (and SQLAlchemy, and MLflow above it) words it.
_SQLITE_FULL = "database or disk is full"


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from or during, each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an error it came from, is a full disk (or quota)."""
    return any(isinstance(e, DiskFull) or isinstance(e, OSError) and e.errno in _NO_ROOM or _SQLITE_FULL in str(e)
               for e in causes(exc))


def full_path(exc: BaseException | None) -> str:
    """The file the first full-disk error along ``exc``'s chain was writing, where it says; ""
    otherwise (SQLite's error names no file). The first, not any: a store's error raised while a
    stage's full disk was being handled carries the stage's error as its context."""
    for e in causes(exc):
        if isinstance(e, OSError) and e.errno in _NO_ROOM:
            return str(e.filename or "")
        if isinstance(e, DiskFull) or _SQLITE_FULL in str(e):
            return ""
    return ""


def may_pass(exc: BaseException) -> bool:
    """Whether a retry of the stage that raised ``exc`` may succeed (a stage resumes per item, so a
    retry is cheap): not where the cause stays (a full or read-only disk, ours that say so, FINAL)."""
    if disk_full(exc) or any(isinstance(e, OSError) and e.errno == _READ_ONLY for e in causes(exc)):
        return False
    if isinstance(exc, ProjectError):
        return exc.may_pass
    return not {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__} & FINAL
