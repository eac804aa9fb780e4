"""OpenAI function-tool schemas built from a Python function's type hints and docstring.

`function_schema(fn)` gives `{"type": "function", "function": {"name", "description",
"parameters"}}`. Supported hints: str, int, float, bool, Literal[...], list[X],
dict, X | None / Optional[X]. A parameter with a default is not required.
The docstring's first paragraph is the description; an `Args:` section (Google
style, `name: text` or `name (type): text`, continuation lines indented) gives
the parameter descriptions.

`schema_hash(schemas)` fingerprints a tool set so that trajectories record which
tools (names, argument types, descriptions) the policy saw: tools that drift
change the hash.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\s*)(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


class SchemaError(TypeError):
    """A function whose signature cannot be expressed as a JSON schema."""


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into (summary, {param: description})."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section, current, arg_indent = m.group(1), None, None
            continue
        if section is None:
            summary.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters") or not line.strip():
            continue
        am = _ARG_LINE.match(line)
        indent = len(line) - len(line.lstrip())
        if am and (arg_indent is None or indent <= arg_indent):
            arg_indent = indent
            current = am.group(2).lstrip("*")
            params[current] = am.group(4).strip()
        elif current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
    # The summary is the first paragraph(s) before any section, joined into one line per paragraph.
    text = "\n".join(summary).strip()
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(paragraphs), params


def type_to_schema(tp: Any, where: str = "") -> dict[str, Any]:
    """JSON schema of one type hint."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    if tp is str:
        return {"type": "string"}
    if tp is bool:  # before int: bool is a subclass of int
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is dict or tp is typing.Dict:  # noqa: UP006
        return {"type": "object"}
    if tp is list or tp is typing.List:  # noqa: UP006
        return {"type": "array"}
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Literal:
        kinds = {type(a) for a in args}
        schema: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1:
            schema = {**type_to_schema(kinds.pop(), where), **schema}
        return schema
    if origin in (list, typing.List, tuple) or origin is getattr(typing, "Sequence", None):  # noqa: UP006
        item = args[0] if args else Any
        return {"type": "array", "items": type_to_schema(item, where)}
    if origin in (dict, typing.Dict):  # noqa: UP006
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return type_to_schema(non_none[0], where)
        return {"anyOf": [type_to_schema(a, where) for a in non_none]}
    raise SchemaError(f"cannot build a JSON schema for type {tp!r}{' of ' + where if where else ''}")


def tool_parameters(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters a model fills in (no *args/**kwargs, no `self`)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out.append(p)
    return out


def resolved_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Type hints with string annotations (from __future__ import annotations) resolved."""
    target = getattr(fn, "__func__", fn)
    try:
        return typing.get_type_hints(target)
    except Exception as exc:  # an unresolvable forward reference is a programming error worth naming
        raise SchemaError(f"cannot resolve the type hints of {getattr(fn, '__name__', fn)!r}: {exc}") from exc


def function_schema(
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
) -> dict[str, Any]:
    """The OpenAI function-tool schema of `fn` (see module docstring)."""
    fname = name or getattr(fn, "__name__", None)
    if not fname:
        raise SchemaError(f"{fn!r} has no name; pass name=")
    summary, arg_docs = parse_docstring(inspect.getdoc(fn))
    hints = resolved_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in tool_parameters(fn):
        prop = type_to_schema(hints.get(p.name, inspect.Parameter.empty), where=f"{fname}.{p.name}")
        if arg_docs.get(p.name):
            prop["description"] = arg_docs[p.name]
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        elif p.default is not None and isinstance(p.default, str | int | float | bool):
            prop["default"] = p.default
        properties[p.name] = prop
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    parameters["additionalProperties"] = False
    return {
        "type": "function",
        "function": {
            "name": fname,
            "description": description if description is not None else summary,
            "parameters": parameters,
        },
    }


def schema_hash(schemas: list[dict[str, Any]]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of the schemas, first 16 hex chars."""
    canonical = json.dumps(schemas, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
