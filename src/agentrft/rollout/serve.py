"""OpenAI-compatible chat endpoint over a TokenSampler that records what it serves.

`create_app(sampler, store=...)` returns a FastAPI app with

* ``POST /v1/chat/completions`` — messages, tools, temperature, top_p, max_tokens
  (or max_completion_tokens), stop, seed, n=1, no streaming. Tools are written
  into the prompt in the chosen tool-call format (or passed to a tool-aware
  template with ``native``); calls in the model's text come back as OpenAI
  ``tool_calls`` with ``finish_reason: "tool_calls"``.
* ``GET /v1/models`` — the one policy served.

Recording choice: **each request is its own trajectory**. Its token record is
exactly the prompt ids the sampler consumed (loss_mask 0) and the ids it
sampled (loss_mask 1), so it is valid training data on its own; a client that
resends a growing conversation produces one trajectory per step, linked by
``metadata.conversation_id`` (a hash of the messages up to the first user
message). Re-using the previous request's ids instead would tie the record to
the client re-sending byte-identical history, which OpenAI clients do not promise.

Errors follow the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``:
a malformed request is a 400 (bad JSON, wrong types, unknown role, n≠1,
streaming), a missing or wrong API key a 401; only a failing policy is a 5xx.
Needs the ``serve`` extra (fastapi, uvicorn); nothing else in rollout imports this module.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrft.rollout.agent import to_render
from agentrft.rollout.formats import make_format
from agentrft.samplers.base import SampleRequest, SamplingParams, TokenSampler
from agentrft.types import EnvRef, Message, ModelCallEvent, TokenRecord, Trajectory, new_id


class ChatRequest(BaseModel):
    """The Chat Completions fields this server honours; other OpenAI fields are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: Literal[1] = 1
    stream: Literal[False] = False


class ApiError(Exception):
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


def _describe_errors(errors: list[Any]) -> tuple[str, str | None]:
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
    message = "; ".join(dict.fromkeys(str(e.get("msg", "invalid")) for e in group))
    return (f"{param}: {message}" if param else message), param


def conversation_id(messages: list[Message]) -> str:
    """Stable id of a conversation: hash of its messages up to and including the first user message."""
    head: list[dict[str, Any]] = []
    for m in messages:
        head.append({"role": m.role, "content": m.text()})
        if m.role == "user":
            break
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode()).hexdigest()[:16]


def _prompt(req: ChatRequest, tool_format: str) -> tuple[list[Message], Any]:
    fmt = make_format(tool_format, req.tools or [])
    messages = [m.model_copy(deep=True) for m in req.messages]
    instructions = fmt.render_tool_instructions(req.tools) if req.tools else ""
    if instructions:
        if messages[0].role in ("system", "developer"):
            messages[0].content = f"{messages[0].text()}\n\n{instructions}".strip()
        else:
            messages.insert(0, Message(role="system", content=instructions))
    return messages, fmt


def create_app(
    sampler: TokenSampler,
    *,
    store: Any = None,
    tool_format: str = "xml",
    api_key: str | None = None,
    run_id: str = "",
    default_max_tokens: int = 512,
) -> FastAPI:
    """The FastAPI app serving `sampler`; each completion is recorded in `store` when given."""
    make_format(tool_format, [])  # fail at start-up, not per request, on an unknown format
    app = FastAPI(title="agentrft serve", docs_url=None, redoc_url=None)
    app.state.recorded = 0
    app.state.store_errors = []

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe_errors(list(exc.errors()))
        return JSONResponse(ApiError(400, message, param=param).body(), status_code=400)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error").body(), status_code=500
        )

    def _check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise ApiError(
                401, "missing or invalid API key (send 'Authorization: Bearer <key>')", code="invalid_api_key"
            )

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _check_key(request)
        return {
            "object": "list",
            "data": [{"id": sampler.policy, "object": "model", "created": 0, "owned_by": "agentrft"}],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> dict[str, Any]:
        _check_key(request)
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        try:
            req = ChatRequest.model_validate(body)
        except ValidationError as exc:
            message, param = _describe_errors(exc.errors())
            raise ApiError(400, message, param=param) from None
        return await _complete(req)

    async def _complete(req: ChatRequest) -> dict[str, Any]:
        messages, fmt = _prompt(req, tool_format)
        tools = req.tools if fmt.native else None
        prompt_ids = list(sampler.render([to_render(m, fmt) for m in messages], tools, add_generation_prompt=True))
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if req.tools and req.tool_choice != "none":
            stops += fmt.stop_strings()
        params = SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            max_tokens=req.max_completion_tokens or req.max_tokens or default_max_tokens,
            stop=list(dict.fromkeys(stops)),
        )
        t0 = time.time()
        try:
            result = await sampler.sample(
                SampleRequest(prompt_ids=prompt_ids, params=params, group_key=conversation_id(req.messages))
            )
        except ValueError as exc:  # the sampler's own request checks (e.g. prompt longer than the context)
            raise ApiError(400, str(exc)) from None
        except Exception as exc:
            raise ApiError(500, f"policy failed: {type(exc).__name__}: {exc}", type_="server_error") from None
        parsed = fmt.parse(result.text) if req.tools and req.tool_choice != "none" else None
        if parsed is not None and parsed.tool_calls:
            message = Message(role="assistant", content=parsed.content or None, tool_calls=parsed.tool_calls)
            finish = "tool_calls"
        else:
            message = Message(role="assistant", content=result.text)
            finish = "length" if result.finish_reason == "length" else "stop"
        completion_id = f"chatcmpl-{new_id()}"
        _record(req, messages, message, prompt_ids, result, completion_id, t0)
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(t0),
            "model": sampler.policy,
            "choices": [{"index": 0, "message": message.to_openai(), "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        }

    def _record(
        req: ChatRequest,
        messages: list[Message],
        reply: Message,
        prompt_ids: list[int],
        result: Any,
        completion_id: str,
        t0: float,
    ) -> None:
        if store is None:
            return
        turn = sum(1 for m in messages if m.role == "assistant")
        sampled = list(result.token_ids)
        traj = Trajectory(
            run_id=run_id,
            task_id=completion_id,
            group_id=conversation_id(req.messages),
            env=EnvRef(name="serve", version="1"),
            policy=sampler.policy,
            policy_version=sampler.policy_version,
            messages=[*messages, reply],
            n_prompt_messages=len(messages),
            events=[
                ModelCallEvent(
                    turn=turn,
                    latency_s=result.latency_s,
                    prompt_tokens=result.prompt_tokens,
                    completion_tokens=result.completion_tokens,
                    finish_reason=result.finish_reason,
                )
            ],
            tokens=TokenRecord(
                ids=prompt_ids + sampled,
                loss_mask=[0] * len(prompt_ids) + [1] * len(sampled),
                logprobs=[0.0] * len(prompt_ids) + [float(x) for x in result.logprobs],
                turn=[turn] * (len(prompt_ids) + len(sampled)),
            ),
            status="truncated" if result.finish_reason == "length" else "completed",
            created_at=t0,
            finished_at=time.time(),
            metadata={
                "conversation_id": conversation_id(req.messages),
                "tools": req.tools or [],
                "tool_format": tool_format,
            },
        )
        try:
            store.add_trajectory(traj)
            app.state.recorded += 1
        except Exception as exc:
            app.state.store_errors.append(f"{completion_id}: {type(exc).__name__}: {exc}")

    return app
