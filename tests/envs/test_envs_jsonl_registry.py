"""JsonlEnv (OpenAI RFT rows) and make_env."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentrft.envs.jsonl import JsonlDataError, JsonlEnv
from agentrft.envs.registry import make_env

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}


def _write(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_rows_become_tasks(tmp_path: Path) -> None:
    p = _write(
        tmp_path / "d.jsonl",
        [
            {"messages": [{"role": "user", "content": "2+2?"}], "answer": 4},
            {
                "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}],
                "tools": [TOOL],
                "id": "row-b",
                "label": "x",
            },
        ],
    )
    env = JsonlEnv(p)
    a, b = env.tasks()
    assert a.data == {"answer": 4} and a.id.startswith("jsonl-")
    assert b.id == "row-b" and b.data == {"id": "row-b", "label": "x"} and b.tools == [TOOL]
    assert env.initial_messages(b)[0].text() == "Be terse."  # the row's own system prompt is kept
    assert env.initial_messages(a)[0].role == "system" and len(env.initial_messages(a)) == 2
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["lookup"]
    ep = env.start(b)
    r = asyncio.run(ep.call_tool("lookup", {}))
    assert r.error_kind == "unknown_tool" and "not executable locally" in r.content
    assert asyncio.run(ep.call_tool("other", {})).error_kind == "unknown_tool"


def test_jsonl_tools_module(tmp_path: Path) -> None:
    mod = tmp_path / "mytools.py"
    mod.write_text('def lookup() -> str:\n    """Look up."""\n    return "found"\n')
    p = _write(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "q"}], "tools": [TOOL]}])
    env = JsonlEnv(p, tools_module=str(mod))
    assert asyncio.run(env.start(env.tasks()[0]).call_tool("lookup", "{}")).content == "found"


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ("{not json", "d.jsonl:2: invalid JSON"),
        ("[1, 2]", "d.jsonl:2: expected a JSON object"),
        ({"answer": 1}, "d.jsonl:2: field 'messages': must be a non-empty list"),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "d.jsonl:2: field 'messages': the last message must be from the user",
        ),
        ({"messages": [{"role": "robot", "content": "a"}]}, "d.jsonl:2: field 'messages[0].role'"),
        (
            {"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]},
            "d.jsonl:2: field 'tools[0].function': must be an object",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function", "function": {}}]},
            "d.jsonl:2: field 'tools[0].function.name': must be 1-64 letters",
        ),
    ],
)
def test_jsonl_bad_lines_name_file_line_field(tmp_path: Path, row: object, expected: str) -> None:
    p = _write(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "ok"}]}, row])
    with pytest.raises(JsonlDataError) as exc:
        JsonlEnv(p)
    assert expected in str(exc.value)


def test_jsonl_grader_spec_file(tmp_path: Path) -> None:
    p = _write(tmp_path / "d.jsonl", [{"messages": [{"role": "user", "content": "q"}], "ref": "a"}])
    spec = {
        "type": "string_check",
        "name": "s",
        "input": "{{ sample.output_text }}",
        "reference": "{{ item.ref }}",
        "operation": "eq",
    }
    (tmp_path / "g.json").write_text(json.dumps(spec))
    assert make_env(f"jsonl:{p}?grader={tmp_path / 'g.json'}").grader_spec() == spec
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(JsonlDataError, match="bad.json:1: invalid JSON"):
        JsonlEnv(p, grader_spec_path=tmp_path / "bad.json")


def test_make_env_specs(tmp_path: Path) -> None:
    assert make_env("finqa-lite").levels == (1, 2, 3, 4)  # type: ignore[attr-defined]
    assert make_env("finqa-lite:1,2").levels == (1, 2)  # type: ignore[attr-defined]
    assert {t.data["level"] for t in make_env("finqa-lite:3").tasks("held-out")} == {3}
    with pytest.raises(ValueError, match="unknown environment 'gsm8k'; valid: finqa-lite"):
        make_env("gsm8k")
    with pytest.raises(ValueError, match="levels must be"):
        make_env("finqa-lite:x")
    with pytest.raises(ValueError, match="among 1, 2, 3, 4"):
        make_env("finqa-lite:7")
    with pytest.raises(ValueError, match="unknown option"):
        make_env(f"jsonl:{tmp_path}/x.jsonl?foo=1")
