"""How recipes merge: mappings key by key, a list's items by position or name (``--set``)."""

from __future__ import annotations

from typing import Any

from embodied_r.errors import RecipeError


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base``, mappings key by key. A mapping over a list changes items by
    position (``"2"``), by ``name`` (``stage3``) or all (``"*"``); any other value replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        elif isinstance(value, dict) and isinstance(out.get(key), list) and value:
            out[key] = _merge_items(out[key], value, key)
        else:
            out[key] = value
    return out


def _merge_items(items: list[Any], over: dict[str, Any], where: str) -> list[Any]:
    out = list(items)
    names = {item.get("name"): i for i, item in enumerate(out) if isinstance(item, dict) and "name" in item}
    for selector, value in over.items():
        if selector == "*":
            picked = range(len(out))
        elif str(selector).isdigit() and int(selector) < len(out):
            picked = [int(selector)]
        elif selector in names:
            picked = [names[selector]]
        else:
            known = ", ".join(str(n) for n in names) or f"0..{len(out) - 1}"
            raise RecipeError(f"{where}.{selector}: no such item in {where}; name one of {known}, a position, or *")
        for i in picked:
            out[i] = deep_merge(out[i], value) if isinstance(value, dict) and isinstance(out[i], dict) else value
    return out
