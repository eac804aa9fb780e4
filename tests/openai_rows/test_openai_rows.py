"""`agentrft.openai_rows`: the rules a conversation or tool list from a user's file must meet."""

from __future__ import annotations

from typing import Any

import pytest

from agentrft.inputs import InputError
from agentrft.openai_rows import parse_messages, parse_tools

USER = {"role": "user", "content": "2+2?"}
CALL = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"e": "2+2"}'}}
TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate.",
        "parameters": {"type": "object", "properties": {"e": {"type": "string"}}, "required": ["e"]},
    },
}


def test_a_full_conversation_passes() -> None:
    messages = parse_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "2+2?"}, {"type": "image_url", "image_url": {}}]},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "4"},
            {"role": "assistant", "content": "4", "refusal": None},
        ]
    )
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[-1].model_extra == {"refusal": None}  # unknown keys are kept
    assert parse_messages([USER, {"role": "assistant", "tool_calls": [CALL]}])[-1].tool_calls  # ends on a call


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "field 'messages': must be a non-empty list of chat messages"),
        ({"role": "user"}, "field 'messages': must be a non-empty list of chat messages"),
        (["hi"], "field 'messages[0]': a message must be an object, not str"),
        ([{"content": "x"}], "field 'messages[0].role': must be one of system, user, assistant, tool, developer; missing"),
        ([{"role": "robot", "content": "x"}], "field 'messages[0].role': must be one of system, user, assistant, tool, developer; not 'robot'"),
        ([{"role": "user", "content": None}], "field 'messages[0].content': a user message needs content"),
        ([{"role": "system"}, USER], "field 'messages[0].content': a system message needs content"),
        ([{"role": "user", "content": 5}], "field 'messages[0].content': must be a string or a list of content parts, not int"),
        ([{"role": "user", "content": ["hi"]}], "field 'messages[0].content[0]': a content part must be an object"),
        ([{"role": "user", "content": [{"type": "text"}]}], "field 'messages[0].content[0].text': a text part needs a string 'text'"),
        ([USER, {"role": "assistant"}], "field 'messages[1].content': an assistant message needs content or tool_calls"),
        ([USER, {"role": "assistant", "tool_calls": []}], "field 'messages[1].content': an assistant message needs content or tool_calls"),
        ([USER, {"role": "tool", "content": "4"}], "field 'messages[1].tool_call_id': a tool message needs the id of the call it answers"),
        ([USER, {"role": "tool", "tool_call_id": "c1", "content": "4"}], "field 'messages[1].tool_call_id': 'c1' answers no tool call of an earlier message"),
        ([{"role": "user", "content": "x", "tool_calls": [CALL]}], "field 'messages[0].tool_calls': only assistant messages make tool calls, not user"),
        ([USER, {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f"}}]}], "field 'messages[1].tool_calls[0].function.arguments': Field required"),
        ([{"role": "user", "content": "x", "name": 3}], "field 'messages[0].name': Input should be a valid string"),
    ],
)  # fmt: skip
def test_bad_conversations_name_the_field(messages: Any, message: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_messages(messages, "d.jsonl:4")
    assert str(exc.value).startswith(f"d.jsonl:4: {message}")


def test_tools_pass_and_fail_by_the_openai_rules() -> None:
    assert parse_tools([TOOL, {"function": {"name": "noop"}}]) == [TOOL, {"function": {"name": "noop"}}]
    fn = TOOL["function"]
    bad: list[tuple[Any, str]] = [
        ("calc", "field 'tools[0]': a tool schema must be an object, not str"),
        ({"type": "retrieval", "function": fn}, "field 'tools[0].type': must be 'function', not 'retrieval'"),
        ({"type": "function"}, "field 'tools[0].function': must be an object"),
        (
            {"function": {**fn, "name": "a b"}},
            "field 'tools[0].function.name': must be 1-64 letters, digits, '_' or '-'",
        ),
        ({"function": {**fn, "name": "x" * 65}}, "field 'tools[0].function.name': must be 1-64"),
        ({"function": {**fn, "description": 7}}, "field 'tools[0].function.description': must be a string"),
        ({"function": {**fn, "parameters": 5}}, "field 'tools[0].function.parameters': must be a JSON Schema object"),
        (
            {"function": {**fn, "parameters": {"type": "array"}}},
            "field 'tools[0].function.parameters.type': must be 'object'",
        ),
        (
            {"function": {**fn, "parameters": {"type": "object", "properties": []}}},
            "field 'tools[0].function.parameters.properties': not a valid JSON Schema: [] is not of type 'object'",
        ),
        (
            {"function": {**fn, "parameters": {"properties": {"e": {"type": "strnig"}}}}},
            "field 'tools[0].function.parameters.properties.e.type': not a valid JSON Schema",
        ),
    ]
    for tool, message in bad:
        with pytest.raises(InputError) as exc:
            parse_tools([tool])
        assert str(exc.value).startswith(message), (tool, str(exc.value))
    with pytest.raises(InputError, match=r"^field 'tools': must be a list"):
        parse_tools(TOOL)
    with pytest.raises(InputError, match=r"field 'tools\[1\]\.function\.name': tool 'calc' is declared twice"):
        parse_tools([TOOL, TOOL])
