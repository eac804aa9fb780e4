"""Wrapping Python functions as tools the model can call, and executing those calls safely.

`Tool.from_function(fn)` builds the schema (see `schema.py`) and a strict argument
validator from the signature. `await tool.call(arguments)` never raises: JSON
that does not parse, wrong types, missing or unknown arguments, timeouts and
exceptions all come back as an error `ToolResult` whose `content` is a short
message the model can act on. Long output is cut at `max_output_chars` with a
visible marker, because a silently clipped observation misleads the policy.

Sync functions run in a worker thread so that one slow tool does not stall the
event loop that plays many episodes at once. A timed-out thread cannot be
killed in Python; it is abandoned (its result dropped). Tools that may hang for
real should be async or run their work in a subprocess (see `sandbox.py`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from agentrft.tools.base import ToolResult
from agentrft.tools.schema import function_schema, resolved_hints, tool_parameters

_MAX_ERROR_CHARS = 300


def _short(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_result(message: str, kind: str, latency_s: float = 0.0) -> ToolResult:
    """An error ToolResult: the message is both what the model sees and the recorded error."""
    text = _short(message)
    return ToolResult(content=text, error=text, error_kind=kind, latency_s=latency_s)


def _args_model(fn: Callable[..., Any], name: str) -> type[BaseModel]:
    """A strict pydantic model of the parameters: '5' is not an int, 1 is not a bool, extras are refused."""
    hints = resolved_hints(fn)
    fields: dict[str, Any] = {}
    for p in tool_parameters(fn):
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints.get(p.name, Any), default)
    config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)
    return create_model(f"{name}_arguments", __config__=config, **fields)


def _describe_validation(exc: ValidationError, expected: list[str]) -> str:
    problems = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ())) or "(arguments)"
        if err.get("type") == "missing":
            problems.append(f"missing required argument '{loc}'")
        elif err.get("type") == "extra_forbidden":
            problems.append(f"unknown argument '{loc}' (expected: {', '.join(expected) or 'none'})")
        else:
            problems.append(f"'{loc}': {err.get('msg', 'invalid')} (got {err.get('input')!r})")
    return "; ".join(problems)


def render_output(value: Any) -> str:
    """What the model sees of a tool's return value."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


@dataclass
class Tool:
    """A callable tool: name, schema, validator, limits."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    args_model: type[BaseModel]
    timeout_s: float = 10.0
    max_output_chars: int = 2000
    param_names: list[str] = field(default_factory=list)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float = 10,
        max_output_chars: int = 2000,
    ) -> Tool:
        tool_name = name or fn.__name__
        return cls(
            name=tool_name,
            fn=fn,
            schema=function_schema(fn, name=tool_name, description=description),
            args_model=_args_model(fn, tool_name),
            timeout_s=float(timeout_s),
            max_output_chars=int(max_output_chars),
            param_names=[p.name for p in tool_parameters(fn)],
        )

    def parse_arguments(self, arguments: dict[str, Any] | str | None) -> dict[str, Any] | ToolResult:
        """Parsed, validated keyword arguments, or the error ToolResult explaining what is wrong."""
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            text = arguments.strip()
            if not text:
                arguments = {}
            else:
                try:
                    arguments = json.loads(text)
                except json.JSONDecodeError as exc:
                    return error_result(
                        f"Error: arguments for {self.name} are not valid JSON ({exc.msg} at char {exc.pos}). "
                        f"Send a JSON object with keys: {', '.join(self.param_names) or 'none'}.",
                        "malformed",
                    )
        if not isinstance(arguments, dict):
            return error_result(
                f"Error: arguments for {self.name} must be a JSON object, got {type(arguments).__name__}.",
                "malformed",
            )
        try:
            parsed = self.args_model.model_validate(arguments)
        except ValidationError as exc:
            return error_result(
                f"Error: bad arguments for {self.name}: {_describe_validation(exc, self.param_names)}", "bad_arguments"
            )
        return {k: getattr(parsed, k) for k in self.param_names}

    async def _invoke(self, kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        value = await asyncio.to_thread(self.fn, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        return value

    def _cap(self, text: str, kwargs: dict[str, Any]) -> tuple[str, bool]:
        if len(text) <= self.max_output_chars:
            return text, False
        cut = len(text) - self.max_output_chars
        hint = ""
        if "page" in self.param_names:
            page = kwargs.get("page") or 1
            hint = f"; use page={int(page) + 1}"
        return f"{text[: self.max_output_chars]}…[truncated {cut} chars{hint}]", True

    async def call(self, arguments: dict[str, Any] | str | None) -> ToolResult:
        """Validate, run with a timeout, cap the output. Never raises (except on cancellation)."""
        start = time.perf_counter()
        kwargs = self.parse_arguments(arguments)
        if isinstance(kwargs, ToolResult):
            kwargs.latency_s = time.perf_counter() - start
            return kwargs
        try:
            value = await asyncio.wait_for(self._invoke(kwargs), timeout=self.timeout_s)
        except TimeoutError:
            return error_result(
                f"Error: {self.name} timed out after {self.timeout_s:g} s.", "timeout", time.perf_counter() - start
            )
        except Exception as exc:  # a tool bug or bad input must reach the model as text, not kill the episode
            message = str(exc).strip() or type(exc).__name__
            return error_result(
                f"Error: {self.name} failed: {type(exc).__name__}: {message}", "exception", time.perf_counter() - start
            )
        text, truncated = self._cap(render_output(value), kwargs)
        return ToolResult(content=text, truncated=truncated, latency_s=time.perf_counter() - start)


class CallableTool(Protocol):
    """What a Toolbox dispatches to: a Python `Tool`, or a tool served elsewhere (`http_tool.HttpTool`)."""

    name: str
    schema: dict[str, Any]

    async def call(self, arguments: dict[str, Any] | str | None) -> ToolResult:
        """Run one call; never raises (failures are error ToolResults)."""
        ...


class Toolbox:
    """A named set of tools with one dispatch point (unknown names become an `unknown_tool` error)."""

    def __init__(self, tools: Iterable[CallableTool]):
        self.tools: dict[str, CallableTool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ValueError(f"duplicate tool name {t.name!r}")
            self.tools[t.name] = t

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema for t in self.tools.values()]

    def only(self, names: Iterable[str]) -> Toolbox:
        """The subset of tools named in `names` (an environment offering fewer tools at a level)."""
        keep = set(names)
        return Toolbox(t for n, t in self.tools.items() if n in keep)

    async def call(self, name: str, arguments: dict[str, Any] | str | None) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            return error_result(
                f"Error: unknown tool {name!r}. Available tools: {', '.join(self.names) or 'none'}.", "unknown_tool"
            )
        return await tool.call(arguments)
