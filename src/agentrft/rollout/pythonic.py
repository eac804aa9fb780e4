"""The ``pythonic`` tool format: calls written as a Python list of keyword calls.

    [get_weather(city="Paris", days_ahead=1), convert(value=21.5, unit="fahrenheit")]

This is the form the Berkeley Function Calling Leaderboard asks models without native tool support to write,
and the one Llama 3.2's chat template uses. Small models that were trained on code write it more readily than
nested JSON: there are no braces to balance and strings quote as in Python.

Reading is `ast` only, nothing is evaluated: a call's name is its (dotted) function expression, its arguments
are keyword arguments whose values are Python literals (`ast.literal_eval`); positional arguments are taken in
the order of the tool's parameters. A list of calls may stand anywhere in the reply (prose around it is the
turn's content); a known tool's call written without the brackets is read too. A bracketed call that does not
parse, or whose arguments are not literals, is a `ParseError` the loop shows to the model. There is no stop
string: a reply may hold several calls, and one call's text has no fixed last character.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from agentrft.rollout.formats import (
    FormatName,
    ParsedTurn,
    ParseError,
    ToolFormat,
    _call,
)
from agentrft.types import ToolCall

_IDENT = r"[A-Za-z_][\w.]*"
# The start of a call list: "[" then a name and "(" (a plain list such as "[1, 2]" is prose).
_LIST_START = re.compile(rf"\[\s*{_IDENT}\s*\(")


class PythonicFormat(ToolFormat):
    name: FormatName = "pythonic"

    def render_tool_instructions(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        schemas = tool_schemas if tool_schemas is not None else self.tool_schemas
        lines = ["You can call these functions (JSON schemas):"]
        lines += [json.dumps(s) for s in schemas]
        lines.append(
            "To call functions, reply with a Python list of calls with keyword arguments, for example "
            "[func_name1(param1=value1, param2=value2), func_name2(param=value)], and wait for their results. "
            "When you know the answer, reply without a call."
        )
        return "\n".join(lines)

    def render_call(self, name: str, arguments: dict[str, Any] | str) -> str:
        return f"[{_render_one(name, arguments)}]"

    def render_calls(self, calls: list[tuple[str, dict[str, Any] | str]]) -> str:
        """All of a message's calls in one list (a list is one reply's calls)."""
        return "[" + ", ".join(_render_one(name, arguments) for name, arguments in calls) + "]"

    def stop_strings(self) -> list[str]:
        return []

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[str] = []
        spans: list[tuple[int, int]] = []

        def take(start: int, end: int, nodes: list[ast.expr]) -> None:
            spans.append((start, end))
            for node in nodes:
                got = self._read(node, text[start:end])
                (errors if isinstance(got, ParseError) else calls).append(got)  # type: ignore[arg-type]

        for m in _LIST_START.finditer(text):
            if spans and m.start() < spans[-1][1]:
                continue
            end, nodes = _smallest(text, m.start(), "]", ast.List)
            if nodes is None:
                name = re.match(rf"\[\s*({_IDENT})", text[m.start() :])
                if name and self._known(name.group(1)) is not None:
                    raw = text[m.start() :]
                    errors.append(ParseError(f"call list is not valid Python: {_syntax(raw)}", raw, name.group(1)))
                    spans.append((m.start(), len(text)))
                continue
            take(m.start(), end, nodes.elts)  # type: ignore[attr-defined]
        if not spans and self.tools:
            names = "|".join(re.escape(n) for n in sorted(self.tools, key=len, reverse=True))
            for m in re.finditer(rf"(?<![\w.])({names})\s*\(", text):
                if spans and m.start() < spans[-1][1]:
                    continue
                end, node = _smallest(text, m.start(), ")", ast.Call)
                if node is not None:
                    take(m.start(), end, [node])
        prose, pos = [], 0
        for start, end in spans:
            prose.append(text[pos:start])
            pos = end
        prose.append(text[pos:])
        return ParsedTurn(content="".join(prose).strip(), tool_calls=calls, errors=errors)

    def _known(self, name: str) -> str | None:
        """The offered tool a written name means (dots read as the underscores offered names have)."""
        for candidate in (name, name.replace(".", "_")):
            if candidate in self.tools:
                return candidate
        return None

    def _read(self, node: ast.expr, raw: str) -> ToolCall | ParseError:
        if not isinstance(node, ast.Call):
            return ParseError(f"every item of a call list must be a call, got {ast.unparse(node)!r}", raw)
        written = ast.unparse(node.func)
        name = self._known(written) or written
        arguments: dict[str, Any] = {}
        params = list((self.tools.get(name, {}).get("parameters") or {}).get("properties") or {})
        if node.args:
            if len(node.args) > len(params):
                return ParseError(f"{name}() takes keyword arguments, e.g. {name}(key=value)", raw, name)
            pairs: list[tuple[str | None, ast.expr]] = list(zip(params, node.args, strict=False))
        else:
            pairs = []
        pairs += [(kw.arg, kw.value) for kw in node.keywords]
        for key, value in pairs:
            if key is None:
                return ParseError(f"{name}() takes keyword arguments, not **", raw, name)
            try:
                arguments[key] = _json_value(ast.literal_eval(value))
            except (ValueError, TypeError, SyntaxError):
                return ParseError(
                    f"argument {key!r} of {name}() must be a literal (a string, number, list or dict), "
                    f"got {ast.unparse(value)!r}",
                    raw,
                    name,
                )
        return _call(name, arguments)


def _smallest(text: str, start: int, closer: str, kind: type[ast.expr]) -> tuple[int, ast.expr | None]:
    """The shortest text[start:end] ending in `closer` that parses as one expression of `kind`."""
    end = text.find(closer, start)
    while end != -1:
        try:
            tree = ast.parse(text[start : end + 1], mode="eval")
        except SyntaxError:
            pass
        else:
            if isinstance(tree.body, kind):
                return end + 1, tree.body
        end = text.find(closer, end + 1)
    return len(text), None


def _syntax(raw: str) -> str:
    try:
        ast.parse(raw, mode="eval")
    except SyntaxError as exc:
        return f"{exc.msg} (column {exc.offset})"
    return "not a list of calls"


def _json_value(value: Any) -> Any:
    """A literal as JSON data: tuples become lists; sets, bytes and complex numbers are refused."""
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"not JSON data: {type(value).__name__}")


def _render_one(name: str, arguments: dict[str, Any] | str) -> str:
    args: Any = arguments
    if isinstance(arguments, str):
        try:
            args = json.loads(arguments)
        except json.JSONDecodeError:
            return f"{name}({arguments})"
    if not isinstance(args, dict):
        return f"{name}({args!r})"
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"
