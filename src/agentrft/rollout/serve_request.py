"""What `agentrft serve` accepts: a chat request checked whole before any model work.

`parse_chat_request(raw, limits)` turns the raw body into a `ChatRequest` or
raises `ApiError` (HTTP 4xx, an OpenAI-style one-line message naming the
`param`). In order:

1. the bytes are UTF-8 (a BOM is allowed) and one JSON object, with no
   NaN/Infinity and no integer of more than 4,300 digits (Python's own limit);
2. nesting is at most `limits.max_json_depth` deep: the body's brackets are
   counted outside strings, so depth is bounded before pydantic, `deepcopy` or
   the chat template recurse into it;
3. no string holds a lone UTF-16 surrogate (``"\\ud800"`` is valid JSON but not
   text; the tokenizer raises TypeError on it);
4. the fields validate (`ChatRequest`: tool schemas in OpenAI's shape, a 64-bit
   seed, at most 16 stop strings, ...);
5. the messages make sense (a user message has content, a tool message names
   its `tool_call_id`, content parts are text, the JSON text of a tool call's
   arguments nests no deeper than the body may);
6. `max_tokens` is within the server's `max_tokens_limit`, `n` within `max_n`.

The check against the model's context needs the prompt's length, so it runs in
`serve.py` after rendering. `ServeLimits` holds every bound.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrft.types import Message

if TYPE_CHECKING:  # fastapi is the `serve` extra: only the server itself needs it at run time
    from fastapi import Request

    from agentrft.rollout.sessions import SessionBook

MiB = 1024 * 1024


class ServeLimits(BaseModel):
    """What one client may ask of the server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_body_bytes: int = Field(
        default=2 * MiB, ge=1024, description="larger request bodies get 413, before any of it is parsed"
    )
    max_tokens_limit: int = Field(default=4096, ge=1, description="largest max_tokens a request may ask for")
    default_max_tokens: int = Field(
        default=512, ge=1, description="max_tokens of a request that sets none (cut to what the context leaves)"
    )
    context_tokens: int | None = Field(
        default=None, ge=2, description="the model's positions: prompt + max_tokens must fit; None: not checked here"
    )
    max_json_depth: int = Field(default=32, ge=4, description="deepest nesting of arrays and objects in a body")
    max_n: int = Field(default=8, ge=1, description="most choices (`n`) one request may ask for")
    max_session_requests: int = Field(
        default=256, ge=1, description="most requests one session may make (each is kept until the session ends)"
    )
    max_sessions: int = Field(default=10_000, ge=1, description="most sessions open at once")
    max_connections: int = Field(
        default=512, ge=1, description="most connections open at once (and below the open-file limit); past it, closed"
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, le=3600, description="a connection whose request headers take longer is closed"
    )
    body_timeout_s: float = Field(
        default=60.0, gt=0, le=3600, description="a request body that takes longer to arrive is a 408"
    )
    max_session_bytes: int = Field(
        default=1 << 30,
        ge=1 << 20,
        description="what all open sessions may hold (token ids and text, `sessions.call_bytes`); past it the least "
        "recently used is recorded as an error episode and forgotten",
    )
    session_idle_s: float = Field(
        default=3600.0, gt=0, le=7 * 86400, description="a session idle this long is recorded as an error and forgotten"
    )

    def session_book(self, on_evict: Any = None) -> SessionBook:
        """An empty book of sessions bounded by these limits."""
        from agentrft.rollout.sessions import SessionBook

        return SessionBook(
            self.max_sessions, max_bytes=self.max_session_bytes, idle_s=self.session_idle_s, on_evict=on_evict
        )

    @model_validator(mode="after")
    def _default_within_limit(self) -> ServeLimits:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) exceeds max_tokens_limit ({self.max_tokens_limit})"
            )
        return self


class ApiError(Exception):
    """An HTTP error with an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# OpenAI's rule for function names; the xml tool format also writes them as tag names.
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class FunctionSpec(BaseModel):
    """A tool's function as OpenAI defines it; `parameters` is a JSON Schema object."""

    model_config = ConfigDict(extra="allow")

    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        if value.get("type", "object") != "object":
            raise ValueError('must be a JSON Schema with "type": "object"')
        props = value.get("properties", {})
        if not isinstance(props, dict) or not all(isinstance(v, dict) for v in props.values()):
            raise ValueError('"properties" must map each parameter name to a JSON Schema object')
        required = value.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError('"required" must be a list of parameter names')
        return value


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    function: FunctionSpec


class ToolChoiceFunction(BaseModel):
    name: ToolName


class ToolChoice(BaseModel):
    type: Literal["function"]
    function: ToolChoiceFunction


StopString = Annotated[str, Field(max_length=256)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool | None = None


class ChatRequest(BaseModel):
    """The Chat Completions fields this server honours; other OpenAI fields are accepted and ignored.
    Optional fields may be null, as OpenAI clients send them."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: StopString | Annotated[list[StopString], Field(max_length=16)] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63, description="a signed 64-bit integer")
    n: int | None = Field(default=None, ge=1, description="choices to sample (at most `ServeLimits.max_n`)")
    stream: bool | None = None
    stream_options: StreamOptions | None = None

    def tool_dicts(self) -> list[dict[str, Any]]:
        """The tools as the client wrote them (what formats and chat templates read); a field sent
        as null is left out, as if not sent."""
        return [t.model_dump(exclude_unset=True, exclude_none=True) for t in self.tools or []]


# --- the body ------------------------------------------------------------------------------------

# A JSON string literal (the body is known to be valid JSON when this runs).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_CURLY_AS_SQUARE = bytes.maketrans(b"{}", b"[]")
# An escaped UTF-16 surrogate; the lone ones are found by encoding the parsed strings.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _too_deep(raw: bytes, limit: int) -> bool:
    """Whether arrays/objects in JSON text nest deeper than `limit`: each pass drops the innermost
    pairs. On text that is not JSON it counts brackets outside string-like spans, which is still a bound."""
    brackets = _STRING.sub(b"", raw).translate(_CURLY_AS_SQUARE, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Path of the first string (or key) holding a lone surrogate; recursion is bounded by the depth check."""
    if isinstance(value, str):
        return None if _is_text(value) else path
    if isinstance(value, dict):
        for k, v in value.items():
            key = k[:64].encode("utf-8", "backslashreplace").decode()
            if not _is_text(k):
                return (*path, key)
            if (found := _lone_surrogate(v, (*path, key))) is not None:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            if (found := _lone_surrogate(v, (*path, str(i)))) is not None:
                return found
    return None


class _NotJson(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not valid JSON")


def _load_json(raw: bytes, limits: ServeLimits) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, f"request body nests deeper than {limits.max_json_depth} levels") from None
    except (json.JSONDecodeError, _NotJson) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    except ValueError:  # Python refuses to convert integers of more than 4,300 digits
        raise ApiError(400, "request body holds an integer of more than 4300 digits") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    if _too_deep(raw, limits.max_json_depth):
        raise ApiError(400, f"request body nests deeper than {limits.max_json_depth} levels")
    if _SURROGATE_ESCAPE.search(raw) and (path := _lone_surrogate(body)) is not None:
        param = ".".join(path)
        raise ApiError(400, f"{param}: string holds a lone UTF-16 surrogate (not valid Unicode text)", param=param)
    return body


def describe_errors(errors: list[Any]) -> tuple[str, str | None]:
    """One message and `param` for pydantic errors. A union field fails once per branch
    (`content.str`, `content.list[...]`): those are merged under the field's own path."""
    if not errors:
        return "invalid request", None
    first = tuple(p for p in errors[0].get("loc", ()) if p != "body")
    group = [
        e
        for e in errors
        if tuple(p for p in e.get("loc", ()) if p != "body")[: max(len(first) - 1, 1)]
        == first[: max(len(first) - 1, 1)]
    ]
    loc = first
    if len(group) > 1:
        locs = [tuple(p for p in e.get("loc", ()) if p != "body") for e in group]
        n = 0
        while all(len(x) > n and x[n] == locs[0][n] for x in locs):
            n += 1
        loc = locs[0][:n]
    param = ".".join(str(p) for p in loc) or None
    message = "; ".join(dict.fromkeys(" ".join(str(e.get("msg", "invalid")).split()) for e in group))
    return (f"{param}: {message}" if param else message), param


def _check_messages(messages: list[Message], limits: ServeLimits) -> None:
    """What the schema cannot say: which roles need content, tool results name their call, text parts
    only, and call arguments (JSON text the formats parse) no deeper than the body may nest."""
    for i, m in enumerate(messages):
        at = f"messages.{i}"
        if m.role == "assistant":
            if m.content is None and not m.tool_calls:
                raise ApiError(
                    400, f"{at}.content: an assistant message needs content or tool_calls", param=f"{at}.content"
                )
        elif m.content is None:
            raise ApiError(400, f"{at}.content: a {m.role} message needs content", param=f"{at}.content")
        if m.role == "tool" and not m.tool_call_id:
            raise ApiError(
                400,
                f"{at}.tool_call_id: a tool message must name the tool_call_id it answers",
                param=f"{at}.tool_call_id",
            )
        for j, call in enumerate(m.tool_calls or []):
            if _too_deep(call.function.arguments.encode("utf-8"), limits.max_json_depth):
                param = f"{at}.tool_calls.{j}.function.arguments"
                raise ApiError(400, f"{param}: nests deeper than {limits.max_json_depth} levels", param=param)
        for j, part in enumerate(m.content if isinstance(m.content, list) else []):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = str(part.get("type"))[:40]
                raise ApiError(
                    400,
                    f"{at}.content.{j}: only text parts are supported (type 'text' with a string 'text'), got type {kind!r}",
                    param=f"{at}.content.{j}",
                )


def requested_max_tokens(req: ChatRequest, limits: ServeLimits) -> tuple[int | None, str]:
    """(max_tokens the client asked for or None, the param that carried it), within the server limit."""
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if asked is not None and asked > limits.max_tokens_limit:
        raise ApiError(
            400,
            f"{param}: {asked} is more than this server allows ({limits.max_tokens_limit}, --max-tokens-limit)",
            param=param,
            code="max_tokens_too_large",
        )
    return asked, param


def parse_chat_request(raw: bytes, limits: ServeLimits) -> ChatRequest:
    """The checked request, or `ApiError` (see the module docstring). CPU-bound: run it off the event loop."""
    body = _load_json(raw, limits)
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as exc:
        message, param = describe_errors(exc.errors())
        raise ApiError(400, message, param=param) from None
    _check_messages(req.messages, limits)
    requested_max_tokens(req, limits)
    if req.n is not None and req.n > limits.max_n:
        raise ApiError(400, f"n: {req.n} is more than this server allows ({limits.max_n})", param="n")
    return req


# --- HTTP ----------------------------------------------------------------------------------------


def one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(str(exc))}"


async def read_body(request: Request, limit: int, timeout_s: float | None = None) -> bytes:
    """The request body, or 413 as soon as it is known to exceed `limit` bytes: from Content-Length
    before reading anything, else (chunked) at the chunk that crosses it; 408 when it has not all
    arrived within ``timeout_s`` (a client that trickles its body holds a connection for nothing)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"request body not received within {timeout_s:g} s", code="request_timeout") from None
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than {limit} bytes (--max-body-bytes)", code="request_too_large")


async def until_disconnected(request: Request) -> None:
    """Return when the client hangs up (the body has been read, so the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.01)  # not expected after the body; keep listening without spinning
