"""TRL's trainer configs, built only from keyword names the installed library has: the
training environment's transformers (5.17, held there by vLLM) is older than the base one's,
so renamed names are read from the installed class and an unknown one fails with the versions
and the names it could have meant, not a bare TypeError."""

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
    return {f.name for f in dataclasses.fields(cls) if f.init}


def field_name(cls: type, setting: str) -> str:
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
