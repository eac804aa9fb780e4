"""OpenAI chat rows read from people's files: the messages and tool schemas, validated in one place.

Used by the `jsonl:` environment (RFT rows), the chat-log import and `agentrft grade` samples.
`Message` itself stays permissive (it also holds what models produce and what older stores
recorded); the rules a conversation handed to agentrft must meet live here, as the OpenAI
chat API applies them:

* ``messages`` is a non-empty list; each message has a known role;
* ``content`` is a string, a list of content parts (objects with a string ``type``; a ``text``
  part carries a string ``text``), or null only for an assistant message with ``tool_calls``;
* only assistant messages carry ``tool_calls``; a ``tool`` message has a ``tool_call_id`` naming
  a call of an earlier assistant message;
* a tool schema is ``{"type": "function", "function": {"name", "description"?, "parameters"?}}``
  with a name of letters, digits, ``_`` and ``-`` (at most 64), unique in the row, a string
  description, and parameters that are a JSON Schema of an object.

Errors are `InputError`: ``WHERE: field 'messages[2].tool_call_id': reason``.
"""

from __future__ import annotations

import re
from typing import Any, get_args

from pydantic import ValidationError

from agentrft.inputs import InputError
from agentrft.types import Message, Role

_ROLES: tuple[str, ...] = get_args(Role)
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _err(where: str, field: str, reason: str) -> InputError:
    text = f"field '{field}': {reason}"
    return InputError(f"{where}: {text}" if where else text)


def _check_content(content: Any, where: str, field: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _err(where, field, f"must be a string or a list of content parts, not {type(content).__name__}")
    for i, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _err(where, f"{field}[{i}]", 'a content part must be an object with a string "type"')
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise _err(where, f"{field}[{i}].text", "a text part needs a string 'text'")


def parse_messages(value: Any, where: str = "", field: str = "messages") -> list[Message]:
    """`value` as a list of `Message`, checked by the rules of the module docstring."""
    if not isinstance(value, list) or not value:
        raise _err(where, field, "must be a non-empty list of chat messages")
    messages: list[Message] = []
    call_ids: set[str] = set()
    for i, raw in enumerate(value):
        at = f"{field}[{i}]"
        if not isinstance(raw, dict):
            raise _err(where, at, f"a message must be an object, not {type(raw).__name__}")
        role = raw.get("role")
        if role not in _ROLES:
            got = f"not {role!r}" if "role" in raw else "missing"
            raise _err(where, f"{at}.role", f"must be one of {', '.join(_ROLES)}; {got}")
        content = raw.get("content")
        _check_content(content, where, f"{at}.content")
        calls = raw.get("tool_calls")
        if calls is not None and role != "assistant":
            raise _err(where, f"{at}.tool_calls", f"only assistant messages make tool calls, not {role}")
        try:
            msg = Message.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            raise _err(where, at + loc, err["msg"]) from None
        if role == "assistant":
            if content is None and not msg.tool_calls:
                raise _err(where, f"{at}.content", "an assistant message needs content or tool_calls")
            call_ids.update(c.id for c in msg.tool_calls or [])
        elif content is None:
            raise _err(where, f"{at}.content", f"a {role} message needs content (a string or content parts)")
        if role == "tool":
            if not msg.tool_call_id:
                raise _err(where, f"{at}.tool_call_id", "a tool message needs the id of the call it answers")
            if msg.tool_call_id not in call_ids:
                raise _err(
                    where, f"{at}.tool_call_id", f"{msg.tool_call_id!r} answers no tool call of an earlier message"
                )
        messages.append(msg)
    return messages


def parse_tools(value: Any, where: str = "", field: str = "tools") -> list[dict[str, Any]]:
    """`value` as a list of OpenAI function tool schemas, checked by the rules of the module docstring."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(value, list):
        raise _err(where, field, "must be a list of function tool schemas")
    names: set[str] = set()
    for i, tool in enumerate(value):
        at = f"{field}[{i}]"
        if not isinstance(tool, dict):
            raise _err(where, at, f"a tool schema must be an object, not {type(tool).__name__}")
        if tool.get("type", "function") != "function":
            raise _err(where, f"{at}.type", f"must be 'function', not {tool['type']!r}")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise _err(where, f"{at}.function", "must be an object with the tool's name, description and parameters")
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise _err(where, f"{at}.function.name", "must be 1-64 letters, digits, '_' or '-'")
        if name in names:
            raise _err(where, f"{at}.function.name", f"tool {name!r} is declared twice")
        names.add(name)
        if "description" in fn and not isinstance(fn["description"], str):
            raise _err(where, f"{at}.function.description", "must be a string")
        params = fn.get("parameters")
        if params is None:
            continue
        if not isinstance(params, dict):
            raise _err(where, f"{at}.function.parameters", "must be a JSON Schema object")
        if params.get("type", "object") != "object":
            raise _err(where, f"{at}.function.parameters.type", "must be 'object' (the arguments are an object)")
        try:
            Draft202012Validator.check_schema(params)
        except SchemaError as exc:
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path)
            raise _err(where, f"{at}.function.parameters{loc}", f"not a valid JSON Schema: {exc.message}") from None
    return value
