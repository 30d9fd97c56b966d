"""Which config fields change a stage's output, and which only change how it is obtained.

:func:`operational` declares the latter; :func:`result_settings` drops them at any depth, so
raising a limit (concurrency, timeouts, retries, servers) never starts a fresh stage folder."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from pydantic_core import PydanticUndefined

MARK = "operational"


def operational(default: Any = PydanticUndefined, **kwargs: Any) -> Any:
    """``pydantic.Field`` for a setting that changes how a result is obtained, never the result."""
    extra = dict(kwargs.pop("json_schema_extra", None) or {})
    extra[MARK] = True
    return Field(default, json_schema_extra=extra, **kwargs)


def operational_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for name, info in model.model_fields.items()
                     if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get(MARK))


def _exclusions(value: Any) -> Any:
    """A pydantic ``exclude`` spec dropping every operational field under ``value``, or None."""
    if isinstance(value, BaseModel):
        spec: dict[Any, Any] = {name: True for name in operational_fields(type(value))}
        for name in type(value).model_fields:
            if name not in spec and (inner := _exclusions(getattr(value, name))) is not None:
                spec[name] = inner
        return spec or None
    if isinstance(value, (list, tuple)):
        spec = {i: inner for i, item in enumerate(value) if (inner := _exclusions(item)) is not None}
        return spec or None
    if isinstance(value, dict):
        spec = {k: inner for k, item in value.items() if (inner := _exclusions(item)) is not None}
        return spec or None
    return None


def result_settings(model: BaseModel, exclude: set[str] | frozenset[str] = frozenset(),
                    mode: str = "json") -> dict[str, Any]:
    """``model`` dumped without its operational fields (nor ``exclude``): what a key hashes."""
    spec = _exclusions(model) or {}
    spec.update({name: True for name in exclude})
    return model.model_dump(mode=mode, exclude=spec)
