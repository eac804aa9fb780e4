"""Tools that live behind HTTP endpoints: a dataset declares the schema, a URL runs the call.

A tool can then be written in any language. The protocol, for one call:

* request: ``POST URL`` with the call's arguments as a JSON object (``Content-Type:
  application/json``), plus the endpoint's configured headers;
* answer ``2xx`` with ``{"result": VALUE}``: the model sees VALUE (a string as it is, anything
  else as JSON, capped at ``max_output_chars`` with a visible marker);
* answer ``2xx`` with ``{"error": "message"}``: a tool error the model sees (``error_kind``
  ``tool_error``): the endpoint says the call was wrong.

Everything else is a tool error too, never an exception out of `call`: arguments that are not a
JSON object or break the declared JSON Schema (``malformed``, ``bad_arguments``; the endpoint is
not called), no answer within ``timeout_s`` (``timeout``), a connection that fails
(``unreachable``), an HTTP status of 400 or more (``http_error``), a body that is not JSON or has
neither key (``bad_response``). Calls are not retried: a tool may not be idempotent.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrft.inputs import InputError, first_problem, read_json
from agentrft.tools.base import ToolResult
from agentrft.tools.registry import error_result, render_output


class HttpEndpoint(BaseModel):
    """Where one tool is served."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="http(s) URL that receives the arguments as a JSON POST")
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="the whole call, connect to last byte")
    headers: dict[str, str] = Field(default_factory=dict, description="sent with every call (e.g. Authorization)")

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")) or len(url) < 8:
            raise ValueError("must be an http:// or https:// URL")
        return url


def parse_endpoints(value: Any, where: str) -> dict[str, HttpEndpoint]:
    """``{tool name: URL or {url, timeout_s, headers}}`` → endpoints; InputError names the tool's field."""
    if not isinstance(value, dict):
        raise InputError(f"{where}: must be an object mapping tool names to URLs")
    out: dict[str, HttpEndpoint] = {}
    for name, spec in value.items():
        body = {"url": spec} if isinstance(spec, str) else spec
        try:
            out[name] = HttpEndpoint.model_validate(body)
        except ValidationError as exc:
            p = first_problem(exc)
            field = f"{name}.{p.field}" if p.field else name
            raise InputError(f"{where}: field '{field}': {p.message}") from None
    return out


def load_endpoints(path: str | Path) -> dict[str, HttpEndpoint]:
    """The endpoints of a JSON file (see `parse_endpoints`)."""
    return parse_endpoints(read_json(path), str(path))


class HttpTool:
    """One declared tool served by an `HttpEndpoint`; `call` never raises (see the module docstring)."""

    def __init__(
        self, schema: dict[str, Any], endpoint: HttpEndpoint, *, max_output_chars: int = 2000, transport: Any = None
    ) -> None:
        from jsonschema import Draft202012Validator

        fn = schema["function"]
        self.name: str = fn["name"]
        self.schema = schema
        self.endpoint = endpoint
        self.timeout_s = endpoint.timeout_s
        self.max_output_chars = max_output_chars
        self.transport = transport  # an httpx transport (tests pass a mock)
        self._validator = Draft202012Validator(fn.get("parameters") or {"type": "object"})

    def _arguments(self, arguments: dict[str, Any] | str | None) -> dict[str, Any] | ToolResult:
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                return error_result(
                    f"Error: arguments for {self.name} are not valid JSON ({exc.msg} at char {exc.pos}).", "malformed"
                )
        if not isinstance(arguments, dict):
            return error_result(
                f"Error: arguments for {self.name} must be a JSON object, got {type(arguments).__name__}.", "malformed"
            )
        problems = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if problems:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problems[0].absolute_path)
            return error_result(
                f"Error: bad arguments for {self.name}: {where.lstrip('.') or '(arguments)'}: {problems[0].message}",
                "bad_arguments",
            )
        return arguments

    async def _post(self, arguments: dict[str, Any]) -> ToolResult:
        import httpx

        async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as client:
            resp = await client.post(self.endpoint.url, json=arguments, headers=self.endpoint.headers)
        if resp.status_code >= 400:
            return error_result(
                f"Error: {self.name} failed: the endpoint answered HTTP {resp.status_code}: {resp.text[:200]}",
                "http_error",
            )
        try:
            body = resp.json()
        except ValueError:
            return error_result(f"Error: {self.name} failed: the endpoint's answer is not JSON.", "bad_response")
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return error_result(f"Error: {self.name}: {body['error']}", "tool_error")
        if not isinstance(body, dict) or "result" not in body:
            return error_result(
                f'Error: {self.name} failed: the endpoint answered neither {{"result": ...}} nor {{"error": "..."}}.',
                "bad_response",
            )
        text = render_output(body["result"])
        if len(text) <= self.max_output_chars:
            return ToolResult(content=text)
        cut = len(text) - self.max_output_chars
        return ToolResult(content=f"{text[: self.max_output_chars]}…[truncated {cut} chars]", truncated=True)

    async def call(self, arguments: dict[str, Any] | str | None) -> ToolResult:
        import httpx

        start = time.perf_counter()
        parsed = self._arguments(arguments)
        if isinstance(parsed, ToolResult):
            result = parsed
        else:
            try:
                result = await asyncio.wait_for(self._post(parsed), timeout=self.timeout_s)
            except (TimeoutError, httpx.TimeoutException):
                result = error_result(f"Error: {self.name} timed out after {self.timeout_s:g} s.", "timeout")
            except httpx.HTTPError as exc:
                result = error_result(
                    f"Error: {self.name} failed: the endpoint cannot be reached ({type(exc).__name__}).", "unreachable"
                )
        result.latency_s = time.perf_counter() - start
        return result
