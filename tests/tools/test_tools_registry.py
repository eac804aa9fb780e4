"""Tool execution: validation, timeout, exceptions, output cap, Toolbox dispatch."""

from __future__ import annotations

import asyncio
import time

from agentrft.tools.registry import Tool, Toolbox


def add(a: int, b: float = 1.5) -> float:
    """Add two numbers."""
    return a + b


def read(doc: str, page: int = 1) -> str:
    """Read a long document."""
    return "x" * 5000


def slow() -> str:
    """Sleep too long."""
    time.sleep(1.0)
    return "late"


async def slow_async() -> str:
    """Sleep too long, async."""
    await asyncio.sleep(5)
    return "late"


def broken(x: str) -> str:
    """Always fails."""
    raise RuntimeError("disk on fire")


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_valid_call_from_json_text_and_dict() -> None:
    tool = Tool.from_function(add)
    r = run(tool.call('{"a": 2, "b": 0.25}'))
    assert r.ok and r.content == "2.25" and not r.truncated and r.latency_s >= 0
    assert run(tool.call({"a": 3})).content == "4.5"


def test_bad_arguments() -> None:
    tool = Tool.from_function(add)
    wrong_type = run(tool.call({"a": "2"}))
    assert wrong_type.error_kind == "bad_arguments" and "'a'" in wrong_type.content
    missing = run(tool.call({}))
    assert missing.error_kind == "bad_arguments" and "missing required argument 'a'" in missing.content
    unknown = run(tool.call({"a": 1, "c": 2}))
    assert unknown.error_kind == "bad_arguments" and "unknown argument 'c'" in unknown.content
    assert run(tool.call({"a": True})).error_kind == "bad_arguments"  # a bool is not an int here


def test_malformed_arguments() -> None:
    tool = Tool.from_function(add)
    assert run(tool.call("{a: 1")).error_kind == "malformed"
    assert run(tool.call("[1, 2]")).error_kind == "malformed"
    assert not run(tool.call("{a: 1")).ok


def test_timeout_sync_and_async() -> None:
    r = run(Tool.from_function(slow, timeout_s=0.1).call({}))
    assert r.error_kind == "timeout" and "timed out after 0.1 s" in r.content
    r = run(Tool.from_function(slow_async, timeout_s=0.1).call({}))  # cut, not the 5 s sleep's late answer
    assert r.error_kind == "timeout" and "timed out after 0.1 s" in r.content


def test_exception_becomes_short_error() -> None:
    r = run(Tool.from_function(broken).call({"x": "y"}))
    assert r.error_kind == "exception"
    assert r.content == "Error: broken failed: RuntimeError: disk on fire"


def test_truncation_marker_with_page_hint() -> None:
    tool = Tool.from_function(read, max_output_chars=100)
    r = run(tool.call({"doc": "d", "page": 3}))
    assert r.truncated and r.ok
    assert r.content == "x" * 100 + "…[truncated 4900 chars; use page=4]"
    r2 = run(Tool.from_function(lambda: "y" * 30, name="gen", max_output_chars=10).call({}))
    assert r2.content == "y" * 10 + "…[truncated 20 chars]"


def test_toolbox_unknown_tool() -> None:
    box = Toolbox([Tool.from_function(add)])
    r = run(box.call("sub", {}))
    assert r.error_kind == "unknown_tool" and "Available tools: add" in r.content
    assert box.schemas()[0]["function"]["name"] == "add"
