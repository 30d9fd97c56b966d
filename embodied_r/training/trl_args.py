"""TRL's trainer configs, built only from keyword names the installed library has.

The trainer process runs in the training environment, whose transformers (5.17, held there
by vLLM 0.31) is older than the base environment's: a name that only a newer release
knows, such as ``activation_checkpointing`` (transformers 5.23), fails there with a
TypeError at start-up. Names that changed between releases are therefore read from the
installed config class's fields, and an unknown name fails with the versions and the
fields it could have meant instead of a bare TypeError.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

# A setting's names, newest first: the first one the installed config class has is used.
RENAMED: dict[str, tuple[str, ...]] = {
    # transformers 5.23 renamed gradient_checkpointing; 5.17 knows only the old name.
    "gradient_checkpointing": ("activation_checkpointing", "gradient_checkpointing"),
}


def init_fields(cls: type) -> set[str]:
    """The keyword arguments a dataclass config takes."""
    return {f.name for f in dataclasses.fields(cls) if f.init}


def field_name(cls: type, setting: str) -> str:
    """The installed ``cls``'s name for ``setting`` (a key of ``RENAMED``)."""
    names = RENAMED[setting]
    fields = init_fields(cls)
    for name in names:
        if name in fields:
            return name
    raise TypeError(f"{cls.__name__} has none of {', '.join(names)}")


def library_versions() -> str:
    from importlib import metadata

    found = []
    for dist in ("trl", "transformers"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def build_config(cls: type, kwargs: dict[str, Any]) -> Any:
    """``cls(**kwargs)``, after checking every name against the installed fields."""
    fields = init_fields(cls)
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(fields), n=3, cutoff=0.6)
            hints.append(f"{name} (did you mean {', '.join(close)}?)" if close else name)
        raise TypeError(
            f"{cls.__name__} of the installed {library_versions()} has no argument "
            f"{'; '.join(hints)}. A name passed through grpo_args/sft_args must exist in the "
            "training environment's versions (infra/training/constraints.txt)."
        )
    return cls(**kwargs)
