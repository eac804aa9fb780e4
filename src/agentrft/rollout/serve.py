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

Errors follow the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``
with a one-line message: a malformed request is a 400, refused before any
tokenizer or model work (`serve_request` lists the checks), a missing or wrong
API key a 401, a body over ``limits.max_body_bytes`` a 413; only a failing
policy is a 5xx.

What one client can hold (`ServeLimits`):

* tokens — ``max_tokens`` above ``max_tokens_limit``, or prompt + ``max_tokens``
  beyond ``context_tokens``, is a 400 naming the param; a request without
  ``max_tokens`` gets the server default cut to the room its prompt leaves;
* the event loop — the body is parsed and the conversation rendered and
  tokenized in worker threads, so ``/v1/models`` and other sessions are answered
  while a large prompt is tokenized;
* the engine — a client that disconnects has its request cancelled: the HF
  engine retires it before its next decode step;
* shutdown — uvicorn lets in-flight requests run for its graceful-shutdown
  timeout (``agentrft serve --shutdown-timeout``), then cancels them; those are
  answered 503 and not recorded. A completion is
  recorded synchronously before its response, so what finished is in the store.

Needs the ``serve`` extra (fastapi, uvicorn); nothing else in rollout imports this module.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from agentrft.rollout.agent import to_render
from agentrft.rollout.formats import ToolFormat, make_format
from agentrft.rollout.serve_request import (
    ApiError,
    ChatRequest,
    ServeLimits,
    describe_errors,
    parse_chat_request,
    requested_max_tokens,
)
from agentrft.samplers.base import SampleRequest, SampleResult, SamplingParams, TokenSampler
from agentrft.types import EnvRef, Message, ModelCallEvent, TokenRecord, Trajectory, new_id

__all__ = ["ApiError", "ChatRequest", "ServeLimits", "conversation_id", "create_app"]


def conversation_id(messages: list[Message]) -> str:
    """Stable id of a conversation: hash of its messages up to and including the first user message."""
    head: list[dict[str, Any]] = []
    for m in messages:
        head.append({"role": m.role, "content": m.text()})
        if m.role == "user":
            break
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class _Prepared:
    """A request rendered for the sampler: the messages as the model sees them and their token ids."""

    messages: list[Message]
    fmt: ToolFormat
    tools: list[dict[str, Any]]
    prompt_ids: list[int]
    conversation_id: str


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_one_line(str(exc))}"


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or 413 as soon as it is known to exceed `limit` bytes: from Content-Length
    before reading anything, else (chunked) at the chunk that crosses it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than {limit} bytes (--max-body-bytes)", code="request_too_large")


async def _until_disconnected(request: Request) -> None:
    """Return when the client hangs up (the body has been read, so the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.01)  # not expected after the body; keep listening without spinning


def create_app(
    sampler: TokenSampler,
    *,
    store: Any = None,
    tool_format: str = "xml",
    api_key: str | None = None,
    run_id: str = "",
    limits: ServeLimits | None = None,
) -> FastAPI:
    """The FastAPI app serving `sampler`; each completion is recorded in `store` when given.

    ``app.state`` counts ``recorded`` completions and ``abandoned`` requests (client gone, or
    still running when shutdown's grace ended), and lists ``store_errors``."""
    limits = limits or ServeLimits()
    if api_key is not None and not api_key:
        raise ValueError("api_key is empty: it would let every client in")
    make_format(tool_format, [])  # fail at start-up, not per request, on an unknown format
    app = FastAPI(title="agentrft serve", docs_url=None, redoc_url=None)
    app.state.recorded = 0
    app.state.abandoned = 0
    app.state.store_errors = []

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        # The rest of an oversized body is never read: the connection cannot carry another request.
        headers = {"connection": "close"} if exc.status == 413 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_errors(list(exc.errors()))
        return JSONResponse(ApiError(400, message, param=param).body(), status_code=400)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(ApiError(500, f"internal error: {_first_line(exc)}", type_="server_error").body(), 500)

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
    async def chat_completions(request: Request) -> Response:
        try:
            _check_key(request)
            raw = await read_body(request, limits.max_body_bytes)
            req = await asyncio.to_thread(parse_chat_request, raw, limits)
            return await _unless_client_leaves(request, _complete(req))
        except asyncio.CancelledError:
            # uvicorn cancels what still runs when its shutdown grace ends: answer, instead of
            # dying with a traceback in the log; the sampler's future was cancelled with us.
            app.state.abandoned += 1
            return JSONResponse(
                ApiError(503, "server is shutting down; request abandoned", type_="server_error").body(), 503
            )

    async def _unless_client_leaves(request: Request, work: Awaitable[dict[str, Any]]) -> Response:
        """Run `work`; cancel it (and so the sampler's request) as soon as the client disconnects."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            task.cancel()  # no-op when done; otherwise the engine retires the request before its next step
        if not task.done() or task.cancelled():
            app.state.abandoned += 1
            return Response(status_code=499)  # nobody reads it: the connection is gone
        return JSONResponse(task.result())

    def _prepare(req: ChatRequest) -> _Prepared:
        """Tools into the prompt, then the chat template and tokenizer: CPU-bound, run off the event loop."""
        tools = req.tool_dicts()
        fmt = make_format(tool_format, tools)
        messages = [m.model_copy(deep=True) for m in req.messages]
        instructions = fmt.render_tool_instructions(tools) if tools else ""
        if instructions:
            if messages[0].role in ("system", "developer"):
                messages[0].content = f"{messages[0].text()}\n\n{instructions}".strip()
            else:
                messages.insert(0, Message(role="system", content=instructions))
        try:
            prompt_ids = list(
                sampler.render([to_render(m, fmt) for m in messages], tools if fmt.native else None, True)
            )
        except Exception as exc:  # the template's own checks (e.g. roles must alternate) on client input
            raise ApiError(
                400,
                f"messages: the chat template cannot render this conversation: {_first_line(exc)}",
                param="messages",
            ) from None
        return _Prepared(messages, fmt, tools, prompt_ids, conversation_id(req.messages))

    def _max_tokens(req: ChatRequest, n_prompt: int) -> int:
        """What to ask the sampler for: the client's max_tokens if prompt + it fit the context, else 400;
        without one, the server default cut to the room the prompt leaves."""
        asked, param = requested_max_tokens(req, limits)
        ctx = limits.context_tokens
        if ctx is None:
            return asked or limits.default_max_tokens
        room = ctx - n_prompt
        if room < 1:
            raise ApiError(
                400,
                f"messages: the prompt is {n_prompt} tokens and leaves no room in the model's context of {ctx} tokens",
                param="messages",
                code="context_length_exceeded",
            )
        if asked is None:
            return min(limits.default_max_tokens, room)
        if asked > room:
            raise ApiError(
                400,
                f"{param}: the prompt ({n_prompt} tokens) + {param} ({asked}) exceeds the model's context of "
                f"{ctx} tokens; ask for at most {room}",
                param=param,
                code="context_length_exceeded",
            )
        return asked

    async def _complete(req: ChatRequest) -> dict[str, Any]:
        prep = await asyncio.to_thread(_prepare, req)
        calls_tools = bool(prep.tools) and req.tool_choice != "none"
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if calls_tools:
            stops += prep.fmt.stop_strings()
        params = SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            max_tokens=_max_tokens(req, len(prep.prompt_ids)),
            stop=list(dict.fromkeys(stops)),
        )
        t0 = time.time()
        try:
            result = await sampler.sample(
                SampleRequest(prompt_ids=prep.prompt_ids, params=params, group_key=prep.conversation_id)
            )
        except ValueError as exc:  # the sampler's own request checks (e.g. prompt longer than the context)
            raise ApiError(400, _one_line(str(exc))) from None
        except Exception as exc:
            raise ApiError(500, f"policy failed: {_first_line(exc)}", type_="server_error") from None
        parsed = prep.fmt.parse(result.text) if calls_tools else None
        if parsed is not None and parsed.tool_calls:
            message = Message(role="assistant", content=parsed.content or None, tool_calls=parsed.tool_calls)
            finish = "tool_calls"
        else:
            message = Message(role="assistant", content=result.text)
            finish = "length" if result.finish_reason == "length" else "stop"
        completion_id = f"chatcmpl-{new_id()}"
        _record(prep, message, result, completion_id, t0)
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

    def _record(prep: _Prepared, reply: Message, result: SampleResult, completion_id: str, t0: float) -> None:
        # Synchronous on purpose: a cancellation (shutdown, disconnect) cannot land between the
        # sampler's answer and the store's commit, so what finished is recorded whole or not at all.
        if store is None:
            return
        messages, prompt_ids = prep.messages, prep.prompt_ids
        turn = sum(1 for m in messages if m.role == "assistant")
        sampled = list(result.token_ids)
        traj = Trajectory(
            run_id=run_id,
            task_id=completion_id,
            group_id=prep.conversation_id,
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
                "conversation_id": prep.conversation_id,
                "tools": prep.tools,
                "tool_format": tool_format,
            },
        )
        try:
            store.add_trajectory(traj)
            app.state.recorded += 1
        except Exception as exc:
            app.state.store_errors.append(f"{completion_id}: {_first_line(exc)}")

    return app
