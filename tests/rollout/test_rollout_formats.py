"""Tool-call formats: render/parse round trips and malformed inputs (never an exception)."""

from __future__ import annotations

import json

import pytest
from rollout_fakes import TOOLS

from agentrft.rollout.formats import ParseError, make_format
from agentrft.types import Message, ToolCall, ToolCallFunction


def _assistant(*calls: tuple[str, dict], content: str | None = None) -> Message:
    return Message(
        role="assistant",
        content=content,
        tool_calls=[
            ToolCall(id=f"c{i}", function=ToolCallFunction(name=n, arguments=json.dumps(a)))
            for i, (n, a) in enumerate(calls)
        ],
    )


def _calls(parsed) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in parsed.tool_calls]


def test_xml_single_string_param_is_bare_and_round_trips() -> None:
    fmt = make_format("xml", TOOLS)
    text = fmt.render_assistant(_assistant(("calculate", {"expression": "5829 - 5735"}), content="Let me compute."))
    assert text == "Let me compute.\n<calculate>5829 - 5735</calculate>"
    parsed = fmt.parse(text)
    assert parsed.content == "Let me compute."
    assert _calls(parsed) == [("calculate", {"expression": "5829 - 5735"})]
    assert parsed.errors == []


def test_xml_multi_param_tool_uses_json_and_round_trips() -> None:
    fmt = make_format("xml", TOOLS)
    text = fmt.render_assistant(_assistant(("lookup", {"key": "revenue", "year": 2019})))
    assert text == '<lookup>{"key": "revenue", "year": 2019}</lookup>'
    assert _calls(fmt.parse("sure " + text + " trailing")) == [("lookup", {"key": "revenue", "year": 2019})]


def test_xml_json_body_accepted_for_string_tool_and_unknown_tags_are_text() -> None:
    fmt = make_format("xml", TOOLS)
    parsed = fmt.parse('<b>hi</b> <calculate>{"expression": "1+2"}</calculate>')
    assert _calls(parsed) == [("calculate", {"expression": "1+2"})]
    assert parsed.content == "<b>hi</b>"
    final = fmt.parse("The answer is 94.")
    assert (final.content, final.tool_calls, final.errors, final.has_calls) == ("The answer is 94.", [], [], False)


@pytest.mark.parametrize(
    "text,needle",
    [
        ('<lookup>{"key": "revenue", </lookup>', "not valid JSON"),
        ("<lookup>revenue 2019</lookup>", "takes a JSON object"),
        ("<calculate>5829 - ", "not closed"),
    ],
)
def test_xml_malformed_calls_are_parse_errors(text: str, needle: str) -> None:
    parsed = make_format("xml", TOOLS).parse(text)
    assert parsed.tool_calls == []
    assert len(parsed.errors) == 1 and needle in parsed.errors[0]
    err = parsed.errors[0]
    assert isinstance(err, ParseError) and err.raw.startswith("<") and err.name in ("lookup", "calculate")
    assert parsed.has_calls


def test_xml_stop_strings_and_instructions() -> None:
    fmt = make_format("xml", TOOLS)
    assert fmt.stop_strings() == ["</calculate>", "</lookup>"]
    instr = fmt.render_tool_instructions(TOOLS)
    assert "- calculate(expression: string)" in instr and "<calculate>...</calculate>" in instr


def test_hermes_round_trip_two_calls() -> None:
    fmt = make_format("hermes", TOOLS)
    msg = _assistant(("calculate", {"expression": "1+1"}), ("lookup", {"key": "k", "year": 1}))
    text = fmt.render_assistant(msg)
    assert text.count("<tool_call>") == 2
    parsed = fmt.parse("Thinking... " + text)
    assert _calls(parsed) == [("calculate", {"expression": "1+1"}), ("lookup", {"key": "k", "year": 1})]
    assert parsed.content == "Thinking..."
    assert fmt.stop_strings() == ["</tool_call>"]


def test_hermes_double_encoded_arguments_and_parameters_key() -> None:
    fmt = make_format("hermes", TOOLS)
    p = fmt.parse(
        '<tool_call>{"name": "calculate", "arguments": "{\\"expression\\": \\"3\\"}"}</tool_call>'
        '<tool_call>{"name": "lookup", "parameters": {"key": "a"}}</tool_call>'
    )
    assert _calls(p) == [("calculate", {"expression": "3"}), ("lookup", {"key": "a"})]


@pytest.mark.parametrize(
    "body,needle",
    [
        ('{"name": "calculate", "arguments": {', "not valid JSON"),
        ('["calculate"]', "must be a JSON object"),
        ('{"arguments": {}}', "must be a JSON object"),
        ('{"name": "calculate", "arguments": 5}', '"arguments"'),
    ],
)
def test_hermes_malformed(body: str, needle: str) -> None:
    parsed = make_format("hermes", TOOLS).parse(f"<tool_call>{body}</tool_call>")
    assert parsed.tool_calls == [] and len(parsed.errors) == 1 and needle in parsed.errors[0]


def test_hermes_unclosed_block_is_an_error() -> None:
    parsed = make_format("hermes", TOOLS).parse('<tool_call>{"name": "calculate"')
    assert parsed.errors and "not closed" in parsed.errors[0]


def test_native_has_no_instructions_and_parses_hermes() -> None:
    fmt = make_format("native", TOOLS)
    assert fmt.native and fmt.render_tool_instructions(TOOLS) == ""
    assert _calls(fmt.parse('<tool_call>{"name": "calculate", "arguments": {"expression": "1"}}</tool_call>')) == [
        ("calculate", {"expression": "1"})
    ]


def test_unknown_format_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="xml, hermes, native, pythonic"):
        make_format("yaml", TOOLS)


def test_pythonic_round_trip_two_calls_in_one_list() -> None:
    fmt = make_format("pythonic", TOOLS)
    msg = _assistant(("calculate", {"expression": "5 - (3)"}), ("lookup", {"key": "a]b", "year": 2019}))
    text = fmt.render_assistant(msg)
    assert text.count("[") == 1 and text.startswith("[calculate(")
    parsed = fmt.parse("Let me see. " + text + " then answer.")
    assert _calls(parsed) == [("calculate", {"expression": "5 - (3)"}), ("lookup", {"key": "a]b", "year": 2019})]
    assert parsed.content == "Let me see.  then answer."
    assert fmt.stop_strings() == []
    assert "[func_name1(param1=value1" in fmt.render_tool_instructions()


def test_pythonic_positional_bare_dotted_and_literal_values() -> None:
    fmt = make_format("pythonic", TOOLS)
    assert _calls(fmt.parse('[lookup("k", year=1)]')) == [("lookup", {"key": "k", "year": 1})]
    assert _calls(fmt.parse('I will call calculate(expression="2*3") now')) == [("calculate", {"expression": "2*3"})]
    assert _calls(fmt.parse("[lookup(key=('a', 1), year=None)]")) == [("lookup", {"key": ["a", 1], "year": None})]
    # an unknown name in a call list is still a call (the episode refuses it, as it refuses any unknown tool)
    assert _calls(fmt.parse("[get_weather(city='Paris')]")) == [("get_weather", {"city": "Paris"})]
    # a plain list is prose, not a call
    assert fmt.parse("The values are [1, 2, 3].").has_calls is False


@pytest.mark.parametrize(
    "text,needle",
    [
        ("[calculate(expression=x)]", "must be a literal"),
        ("[calculate(expression={1, 2})]", "must be a literal"),
        ('[calculate(expression="1"', "not valid Python"),
        ('[lookup("k", 1, 2)]', "keyword arguments"),
        ("[calculate(**opts)]", "not **"),
        ("[calculate(expression='1'), 7]", "must be a call"),
    ],
)
def test_pythonic_malformed(text: str, needle: str) -> None:
    parsed = make_format("pythonic", TOOLS).parse(text)
    assert len(parsed.errors) == 1 and needle in parsed.errors[0]
