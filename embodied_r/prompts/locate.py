"""Find a text by its place in a Python file, without running the file, as a ``str.format`` template that
gives exactly the string the original code built."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from string import Formatter
from typing import Literal

from embodied_r.errors import PromptsError


Holder = Literal["assign", "return", "message", "keyword"]


@dataclass(frozen=True)
class Spot:
    """Where one text lives: ``key`` names it in the prompts file; the n-th ``occurrence`` in source
    order, in ``scope`` (``Class.method``, ``function``, or ``""``: the module's own statements)."""

    key: str
    file: str
    scope: str
    holder: Holder = "assign"
    name: str = ""  # the variable (assign), the message role (message) or the argument (keyword)
    occurrence: int = 1
    fields: tuple[str, ...] = ()  # the variables the text is filled with, as the code names them

    def where(self) -> str:
        what = {"assign": f"the value of {self.name!r}", "return": "the return value",
                "message": f"the {self.name!r} message",
                "keyword": f"the argument {self.name}="}[self.holder]
        nth = f" (assignment {self.occurrence})" if self.holder == "assign" and self.occurrence > 1 else ""
        return f"{what}{nth} in {self.scope or 'the module body'} of {self.file}"


@dataclass(frozen=True)
class Template:
    text: str
    fields: tuple[str, ...]


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _percent(fmt: str, names: list[str], spot: Spot) -> str:
    out, i, used = [], 0, 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(_escape(ch))
            i += 1
            continue
        nxt = fmt[i + 1: i + 2]
        if nxt == "%":
            out.append("%")
        elif nxt == "s" and used < len(names):
            out.append("{" + names[used] + "}")
            used += 1
        else:
            raise PromptsError(f"{spot.key}: {spot.where()} uses a %-directive other than %s; "
                               "the code has changed: update the checkout or report it")
        i += 2
    if used != len(names):
        raise PromptsError(f"{spot.key}: {spot.where()} has {used} %s for {len(names)} values; the code has changed")
    return "".join(out)


def template_of(node: ast.expr, spot: Spot) -> Template:
    """The template a literal, f-string (its fields keep the variables' names), ``+`` or ``%s``
    expression builds; literal braces doubled."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return Template(_escape(node.value), ())
    if isinstance(node, ast.JoinedStr):
        parts, fields = [], []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(_escape(str(value.value)))
            elif (isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name)
                  and value.conversion == -1 and value.format_spec is None):
                parts.append("{" + value.value.id + "}")
                fields.append(value.value.id)
            else:
                raise PromptsError(f"{spot.key}: {spot.where()} formats an expression, not a variable; "
                                   "the code has changed")
        return Template("".join(parts), tuple(fields))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = template_of(node.left, spot), template_of(node.right, spot)
        return Template(left.text + right.text, left.fields + right.fields)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = node.left
        if not (isinstance(left, ast.Constant) and isinstance(left.value, str)):
            raise PromptsError(f"{spot.key}: {spot.where()} is not a literal text; the code has changed")
        args = node.right.elts if isinstance(node.right, ast.Tuple) else [node.right]
        if not all(isinstance(a, ast.Name) for a in args):
            raise PromptsError(f"{spot.key}: {spot.where()} fills in an expression, not a variable; "
                               "the code has changed")
        names = [a.id for a in args]  # type: ignore[attr-defined]
        return Template(_percent(left.value, names, spot), tuple(names))
    raise PromptsError(f"{spot.key}: {spot.where()} is not a text (found {type(node).__name__}); "
                       "the code has changed")


def _scope_body(tree: ast.Module, scope: str) -> list[ast.stmt] | None:
    if not scope:
        return tree.body
    body: list[ast.stmt] = tree.body
    for part in scope.split("."):
        found = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.name == part), None)
        if found is None:
            return None
        body = found.body
    return body


def _walk_scope(body: list[ast.stmt]):
    """Every node of a scope in source order, nested functions and classes left out."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _candidates(body: list[ast.stmt], spot: Spot) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in _walk_scope(body):
        if spot.holder == "assign" and isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == spot.name for t in node.targets):
            found.append(node.value)
        elif spot.holder == "assign" and isinstance(node, ast.AnnAssign) and node.value is not None \
                and isinstance(node.target, ast.Name) and node.target.id == spot.name:
            found.append(node.value)
        elif spot.holder == "return" and isinstance(node, ast.Return) and node.value is not None:
            found.append(node.value)
        elif spot.holder == "keyword" and isinstance(node, ast.Call):
            found += [k.value for k in node.keywords if k.arg == spot.name]
        elif spot.holder == "message" and isinstance(node, ast.Dict):
            items = {k.value: v for k, v in zip(node.keys, node.values)
                     if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            role = items.get("role")
            if isinstance(role, ast.Constant) and role.value == spot.name and "content" in items:
                found.append(items["content"])
    return found


def locate(checkout: Path, spot: Spot) -> Template:
    path = Path(checkout) / spot.file
    if not path.is_file():
        raise PromptsError(f"{spot.key}: {spot.file} not found in {checkout}; the checkout is not the "
                           "expected repository or its code has moved")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise PromptsError(f"{spot.key}: {path} does not parse as Python ({exc})") from None
    body = _scope_body(tree, spot.scope)
    if body is None:
        raise PromptsError(f"{spot.key}: no {spot.scope} in {spot.file}; the code has moved")
    found = _candidates(body, spot)
    if len(found) < spot.occurrence:
        raise PromptsError(f"{spot.key}: {spot.where()} not found; the code has moved")
    template = template_of(found[spot.occurrence - 1], spot)
    if set(template.fields) != set(spot.fields):
        raise PromptsError(f"{spot.key}: {spot.where()} is filled with {list(template.fields)}, not "
                           f"{list(spot.fields)}; the code has changed")
    return template


def rename_fields(template: str, mapping: dict[str, str]) -> str:
    """``template`` with each ``{field}`` replaced by ``mapping[field]``, itself template text."""
    out = []
    for literal, field, spec, conversion in Formatter().parse(template):
        out.append(_escape(literal))
        if field is not None:
            if spec or conversion:
                raise PromptsError(f"template field {{{field}}} carries a format spec; not supported")
            out.append(mapping.get(field, "{" + field + "}"))
    return "".join(out)
