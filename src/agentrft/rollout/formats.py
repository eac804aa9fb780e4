"""Tool-call text formats: how a tool call looks in the model's own text.

Four formats, chosen per run (`tool_format=`):

* ``xml`` (default) — one tag per tool, named after the tool. A tool whose only
  parameter is a string takes the bare value, anything else takes a JSON object::

      <calculate>5829 - 5735</calculate>
      <open>{"doc_id": "ACME-2019", "page": 2}</open>

  Why this form: a 135M model imitates a few-shot example best when the call is
  short and has no nesting or quoting to get right. `<calculate>5829 - 5735</calculate>`
  has none; the JSON form of the OpenAI API (`{"name": ..., "arguments": {...}}`)
  has two levels of braces and escaped quotes, which small models break often.
  The closing tag is a stop string, so a turn holds at most one call.
* ``hermes`` — the Hermes/Qwen convention, one JSON object per call::

      <tool_call>{"name": "calculate", "arguments": {"expression": "5829 - 5735"}}</tool_call>
* ``native`` — the chat template's own tool support: tools and `tool_calls`
  are passed to the template as they are; the model's text is parsed as hermes,
  which is what tool-aware templates (Qwen2.5, Hermes, SmolLM3) emit.
* ``pythonic`` — a Python list of keyword calls, the form BFCL prompts models
  without native tool support to write (and Llama 3.2's template uses)::

      [calculate(expression="5829 - 5735"), open(doc_id="ACME-2019", page=2)]

  Read with `ast`, never evaluated (`pythonic.py`).

Parsing never raises: a call that cannot be read becomes a `ParseError` (a str
carrying the raw text), which the agent loop shows to the model as a tool error.
"""

from __future__ import annotations

import contextlib
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrft.types import Message, ToolCall, ToolCallFunction, new_id

FormatName = Literal["xml", "hermes", "native", "pythonic"]
FORMAT_NAMES: tuple[str, ...] = ("xml", "hermes", "native", "pythonic")


class ParseError(str):
    """A malformed tool call: the message shown to the model, plus what was read.

    A `str` subclass so `ParsedTurn.errors` is a plain list of messages for
    callers that only want the text, while the loop still knows the raw call.
    """

    raw: str
    name: str | None

    def __new__(cls, message: str, raw: str = "", name: str | None = None) -> ParseError:
        obj = super().__new__(cls, message)
        obj.raw = raw
        obj.name = name
        return obj


@dataclass
class ParsedTurn:
    """One assistant turn read back from text: prose outside calls, the calls, the malformed calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def has_calls(self) -> bool:
        return bool(self.tool_calls or self.errors)


def _call(name: str, arguments: dict[str, Any]) -> ToolCall:
    return ToolCall(id=f"call_{new_id()[-12:]}", function=ToolCallFunction(name=name, arguments=json.dumps(arguments)))


def _arguments(call: ToolCall | dict[str, Any]) -> tuple[str, dict[str, Any] | str]:
    """(name, arguments) of an OpenAI tool call, arguments parsed from JSON text when possible."""
    if isinstance(call, ToolCall):
        name, raw = call.function.name, call.function.arguments
    else:
        fn = call.get("function", {})
        name, raw = fn.get("name", ""), fn.get("arguments", "{}")
    if isinstance(raw, dict):
        return name, raw
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError):
        return name, raw
    return name, value if isinstance(value, dict) else raw


def _tool_index(tool_schemas: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for schema in tool_schemas:
        fn = schema.get("function", schema)
        if "name" in fn:
            out[fn["name"]] = fn
    return out


def _single_string_param(fn: dict[str, Any]) -> str | None:
    """Name of the tool's only parameter when that parameter is a string, else None."""
    props = (fn.get("parameters") or {}).get("properties") or {}
    if len(props) != 1:
        return None
    ((pname, pschema),) = props.items()
    return pname if isinstance(pschema, dict) and pschema.get("type") == "string" else None


def _describe(fn: dict[str, Any]) -> str:
    props = (fn.get("parameters") or {}).get("properties") or {}
    params = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items() if isinstance(v, dict))
    return f"- {fn['name']}({params}): {fn.get('description', '').strip()}"


class ToolFormat(ABC):
    """Base of the formats. Built for one tool set, because the xml form needs the tool names."""

    name: FormatName
    native: bool = False  # True: pass tools and tool_calls to the chat template untouched

    def __init__(self, tool_schemas: list[dict[str, Any]]) -> None:
        self.tool_schemas = tool_schemas
        self.tools = _tool_index(tool_schemas)

    @abstractmethod
    def render_tool_instructions(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        """See the subclasses."""

    @abstractmethod
    def render_call(self, name: str, arguments: dict[str, Any] | str) -> str:
        """See the subclasses."""

    def render_assistant(self, message: Message | dict[str, Any]) -> str:
        """The model text of an OpenAI assistant message: its content, then each call in this format."""
        msg = message if isinstance(message, Message) else Message.model_validate(message)
        parts = [msg.text()] if msg.text() else []
        if msg.tool_calls:
            parts.append(self.render_calls([_arguments(call) for call in msg.tool_calls]))
        return "\n".join(parts)

    def render_calls(self, calls: list[tuple[str, dict[str, Any] | str]]) -> str:
        """One message's calls as text: each on its own line."""
        return "\n".join(self.render_call(name, arguments) for name, arguments in calls)

    @abstractmethod
    def parse(self, text: str) -> ParsedTurn:
        """See the subclasses."""

    @abstractmethod
    def stop_strings(self) -> list[str]:
        """See the subclasses."""


class XmlFormat(ToolFormat):
    name: FormatName = "xml"

    def render_tool_instructions(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        tools = _tool_index(tool_schemas) if tool_schemas is not None else self.tools
        lines = ["You can use these tools:"]
        lines += [_describe(fn) for fn in tools.values()]
        lines.append(
            "To use a tool, write the tool name as a tag around its input, for example "
            + self._example(tools)
            + ". Use one tool per message and wait for its result. "
            "When you know the answer, reply with the answer only, without any tag."
        )
        return "\n".join(lines)

    def _example(self, tools: dict[str, dict[str, Any]]) -> str:
        for fn in tools.values():
            if _single_string_param(fn):
                return f"<{fn['name']}>...</{fn['name']}>"
        if tools:
            name = next(iter(tools))
            return f'<{name}>{{"arg": "value"}}</{name}>'
        return "<tool>...</tool>"

    def render_call(self, name: str, arguments: dict[str, Any] | str) -> str:
        param = _single_string_param(self.tools.get(name, {}))
        if isinstance(arguments, dict) and param and set(arguments) == {param} and isinstance(arguments[param], str):
            body = arguments[param]
        else:
            body = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return f"<{name}>{body}</{name}>"

    def stop_strings(self) -> list[str]:
        return [f"</{name}>" for name in self.tools]

    def parse(self, text: str) -> ParsedTurn:
        if not self.tools:
            return ParsedTurn(content=text.strip())
        names = "|".join(re.escape(n) for n in sorted(self.tools, key=len, reverse=True))
        # An opening tag of a known tool, then either its closing tag or the end of text (unclosed).
        pattern = re.compile(rf"<({names})>(.*?)(</\1>|$)", re.DOTALL)
        calls: list[ToolCall] = []
        errors: list[str] = []
        prose: list[str] = []
        pos = 0
        for m in pattern.finditer(text):
            prose.append(text[pos : m.start()])
            pos = m.end()
            name, body, closing = m.group(1), m.group(2), m.group(3)
            raw = m.group(0)
            if not closing:
                errors.append(ParseError(f"tool call <{name}> is not closed with </{name}>", raw, name))
                continue
            args = self._read_body(name, body)
            if isinstance(args, ParseError):
                errors.append(args)
            else:
                calls.append(_call(name, args))
        prose.append(text[pos:])
        return ParsedTurn(content="".join(prose).strip(), tool_calls=calls, errors=errors)

    def _read_body(self, name: str, body: str) -> dict[str, Any] | ParseError:
        raw = f"<{name}>{body}</{name}>"
        param = _single_string_param(self.tools[name])
        stripped = body.strip()
        if stripped.startswith("{"):
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as exc:
                if param is None:
                    return ParseError(
                        f"arguments of <{name}> are not valid JSON: {exc.msg} (column {exc.colno})", raw, name
                    )
            else:
                if isinstance(value, dict):
                    return value
        if param is not None:
            return {param: stripped}
        return ParseError(
            f'<{name}> takes a JSON object of arguments, e.g. <{name}>{{"key": "value"}}</{name}>', raw, name
        )


class HermesFormat(ToolFormat):
    name: FormatName = "hermes"
    _BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def render_tool_instructions(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        schemas = tool_schemas if tool_schemas is not None else self.tool_schemas
        lines = ["You can call these tools (JSON schemas):", "<tools>"]
        lines += [json.dumps(s) for s in schemas]
        lines.append("</tools>")
        lines.append(
            'To call a tool, write <tool_call>{"name": <tool name>, "arguments": <arguments object>}'
            "</tool_call> and wait for its result. When you know the answer, reply without a tool call."
        )
        return "\n".join(lines)

    def render_call(self, name: str, arguments: dict[str, Any] | str) -> str:
        args: Any = arguments
        if isinstance(arguments, str):
            try:
                args = json.loads(arguments)
            except json.JSONDecodeError:
                args = arguments
        return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"

    def stop_strings(self) -> list[str]:
        return ["</tool_call>"]

    def parse(self, text: str) -> ParsedTurn:
        calls: list[ToolCall] = []
        errors: list[str] = []
        prose: list[str] = []
        pos = 0
        for m in self._BLOCK.finditer(text):
            prose.append(text[pos : m.start()])
            pos = m.end()
            body, raw = m.group(1).strip(), m.group(0)
            if not m.group(2):
                errors.append(ParseError("tool call is not closed with </tool_call>", raw))
                continue
            got = _read_hermes(body, raw)
            (errors if isinstance(got, ParseError) else calls).append(got)  # type: ignore[arg-type]
        prose.append(text[pos:])
        return ParsedTurn(content="".join(prose).strip(), tool_calls=calls, errors=errors)


def _read_hermes(body: str, raw: str) -> ToolCall | ParseError:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return ParseError(f"tool call is not valid JSON: {exc.msg} (column {exc.colno})", raw)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParseError('tool call must be a JSON object {"name": ..., "arguments": {...}}', raw)
    name = obj["name"]
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(args)
    if not isinstance(args, dict):
        return ParseError(f'"arguments" of tool call {name!r} must be a JSON object', raw, name)
    return _call(name, args)


class NativeFormat(HermesFormat):
    """The chat template renders tools and calls itself; only parsing is ours (hermes blocks)."""

    name: FormatName = "native"
    native = True

    def render_tool_instructions(self, tool_schemas: list[dict[str, Any]] | None = None) -> str:
        return ""


def make_format(name: str, tool_schemas: list[dict[str, Any]]) -> ToolFormat:
    """The format `name` for this tool set; an unknown name lists the valid ones."""
    from agentrft.rollout.pythonic import PythonicFormat

    formats: dict[str, type[ToolFormat]] = {
        "xml": XmlFormat,
        "hermes": HermesFormat,
        "native": NativeFormat,
        "pythonic": PythonicFormat,
    }
    try:
        cls = formats[name]
    except KeyError:
        raise ValueError(f"unknown tool format {name!r}; valid: {', '.join(FORMAT_NAMES)}") from None
    return cls(tool_schemas)
