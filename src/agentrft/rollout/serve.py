"""OpenAI-compatible chat endpoint over a TokenSampler that records what it serves.

`create_app(sampler, store=...)` returns a FastAPI app with

* ``POST /v1/chat/completions`` — messages, tools, temperature, top_p, max_tokens
  (or max_completion_tokens), stop, seed, ``n`` choices (choice i samples with
  seed + i), ``stream`` (server-sent events, `sse.py`). Tools are written
  into the prompt in the chosen tool-call format (or passed to a tool-aware
  template with ``native``); calls in the model's text come back as OpenAI
  ``tool_calls`` with ``finish_reason: "tool_calls"``.
* ``GET /v1/models`` — the one policy served.
* Sessions: ``POST /v1/sessions/{id}/chat/completions`` (and ``GET .../models``), or the
  ``X-Agentrft-Session: id`` header, make the request part of episode ``id``
  (`sessions.py`); ``POST /v1/sessions/{id}/end`` records the episode and forgets it.

Recording choice. Outside a session **each request is its own trajectory** (each
choice, with ``n > 1``). Its token record is exactly the prompt ids the sampler
consumed (loss_mask 0) and the ids it sampled (loss_mask 1), so it is valid
training data on its own; a client that resends a growing conversation produces
one trajectory per step, linked by ``metadata.conversation_id`` (a hash of the
messages up to the first user message). Inside a session the requests are
stitched into one episode (`stitch.py`): a request that continues an earlier
one reuses that request's ids (the model's own sampled ids, never re-tokenised),
and a client that rewrote its history starts a new segment, with the reason.
Sessions still open at shutdown are recorded then.

``sampling`` (agent commands, `agent_command.py`): the run's sampling distribution
replaces each request's temperature and top-p, and caps its max_tokens, because the
trainer trains the distribution the sampler drew from. A client's ``seed`` is ignored
then (and counted, ``app.state.ignored_seeds``): a program that always sends the same
seed would have every episode of a group sample the same tokens, and the group would
carry no signal; the run's sampler seeds each request itself.

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
* connections — at most ``max_connections`` at once; headers due within
  ``header_timeout_s``, the body within ``body_timeout_s`` (a 408); the log gets one
  line per condition (`serve_http`, the uvicorn config both servers run with);
* sessions — bounded by count, bytes and idle time; an evicted one is recorded as
  an error episode with its reason (`sessions.SessionBook`);
* shutdown — uvicorn lets in-flight requests run for its graceful-shutdown
  timeout (``agentrft serve --shutdown-timeout``), then cancels them; those are
  answered 503 and not recorded. A completion is
  recorded synchronously before its response, so what finished is in the store.

Needs the ``serve`` extra (fastapi, uvicorn); nothing else in rollout imports this module.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from agentrft.rollout.serve_chat import ChatService
from agentrft.rollout.serve_record import conversation_id
from agentrft.rollout.serve_request import (
    ApiError,
    ChatRequest,
    ServeLimits,
    describe_errors,
    first_line,
    parse_chat_request,
    read_body,
    until_disconnected,
)
from agentrft.rollout.sessions import SESSION_HEADER, SESSION_ID, SessionBook
from agentrft.rollout.sse import completion_chunks
from agentrft.samplers.base import SamplingParams, TokenSampler

__all__ = ["ApiError", "ChatRequest", "ServeLimits", "conversation_id", "create_app"]


def create_app(
    sampler: TokenSampler,
    *,
    store: Any = None,
    tool_format: str = "xml",
    api_key: str | None = None,
    run_id: str = "",
    limits: ServeLimits | None = None,
    sessions: SessionBook | None = None,
    sampling: SamplingParams | None = None,
) -> FastAPI:
    """The FastAPI app serving `sampler`; each completion is recorded in `store` when given.

    ``sessions``: where session requests are kept (the caller ends them, e.g. `agent_command`);
    without it the app keeps its own and records each session in `store` when it ends.
    ``sampling``: the distribution every request samples from (see the module docstring).
    ``app.state`` counts ``recorded`` completions and ``abandoned`` requests (client gone, or
    still running when shutdown's grace ended), and lists ``store_errors``. The completions themselves are
    `serve_chat.ChatService`'s; here are the routes, the API key, the body's limits and the error shapes."""
    limits = limits or ServeLimits()
    if api_key is not None and not api_key:
        raise ValueError("api_key is empty: it would let every client in")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if chat.own_sessions:  # what the clients never ended is still an episode
            for sid in chat.book.ids():
                chat.end_session(sid)

    app = FastAPI(title="agentrft serve", docs_url=None, redoc_url=None, lifespan=lifespan)
    chat = ChatService(
        sampler,
        app.state,
        store=store,
        tool_format=tool_format,
        run_id=run_id,
        limits=limits,
        sessions=sessions,
        sampling=sampling,
    )
    _error_handlers(app)
    models = {
        "object": "list",
        "data": [{"id": sampler.policy, "object": "model", "created": 0, "owned_by": "agentrft"}],
    }

    @app.get("/v1/models")
    @app.get("/v1/sessions/{session_id}/models")
    async def list_models(request: Request) -> dict[str, Any]:
        _check_key(request, api_key)
        return models

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        _check_key(request, api_key)  # before the header: a client without the key learns nothing of sessions
        header = request.headers.get(SESSION_HEADER)
        sid = None if header is None else _session_id(header, "X-Agentrft-Session")
        return await _chat(app, chat, request, sid, api_key)

    @app.post("/v1/sessions/{session_id}/chat/completions")
    async def session_chat_completions(request: Request, session_id: str) -> Response:
        return await _chat(app, chat, request, _session_id(session_id, "session id"), api_key)

    @app.post("/v1/sessions/{session_id}/end")
    async def end_session(request: Request, session_id: str) -> dict[str, Any]:
        _check_key(request, api_key)
        if not chat.own_sessions:
            raise ApiError(400, "this server's sessions are ended by the process that runs them")
        traj = chat.end_session(_session_id(session_id, "session id"))
        if traj is None:
            raise ApiError(404, f"no open session {session_id!r}", code="session_not_found")
        segments = traj.tokens.num_segments if traj.tokens is not None else 0
        return {"id": traj.id, "session_id": session_id, "requests": traj.metadata["requests"], "segments": segments}

    return app


def _error_handlers(app: FastAPI) -> None:
    """Every error in the OpenAI shape, with a one-line message (see the module docstring)."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        # The rest of an oversized body is never read: the connection cannot carry another request.
        headers = {"connection": "close"} if exc.status in (408, 413) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_errors(list(exc.errors()))
        return JSONResponse(ApiError(400, message, param=param).body(), status_code=400)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(ApiError(500, f"internal error: {first_line(exc)}", type_="server_error").body(), 500)


def _check_key(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(token.encode(), api_key.encode()):
        raise ApiError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')", code="invalid_api_key")


def _session_id(value: str, where: str) -> str:
    if not SESSION_ID.fullmatch(value):
        raise ApiError(
            400, f"{where}: a session id is 1-128 characters of A-Z a-z 0-9 . _ : -", code="invalid_session_id"
        )
    return value


async def _chat(app: FastAPI, chat: ChatService, request: Request, sid: str | None, api_key: str | None) -> Response:
    """One chat completion request: the key, the body within its limits, the completion unless the client
    leaves first, the answer (JSON or server-sent events)."""
    try:
        _check_key(request, api_key)
        try:
            raw = await read_body(request, chat.limits.max_body_bytes, chat.limits.body_timeout_s)
        except ClientDisconnect:  # a half-sent body: the client is gone; nobody reads an answer, no traceback
            app.state.abandoned += 1
            return Response(status_code=499)
        req = await asyncio.to_thread(parse_chat_request, raw, chat.limits)
        result = await _unless_client_leaves(app, request, chat.complete(req, sid))
    except asyncio.CancelledError:
        # uvicorn cancels what still runs when its shutdown grace ends: answer, instead of
        # dying with a traceback in the log; the sampler's future was cancelled with us.
        app.state.abandoned += 1
        return JSONResponse(
            ApiError(503, "server is shutting down; request abandoned", type_="server_error").body(), 503
        )
    if result is None:
        return Response(status_code=499)  # nobody reads it: the connection is gone
    if req.stream:
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(completion_chunks(result, usage), media_type="text/event-stream")
    return JSONResponse(result)


async def _unless_client_leaves(
    app: FastAPI, request: Request, work: Awaitable[dict[str, Any]]
) -> dict[str, Any] | None:
    """Run `work`; cancel it (and so the sampler's request) as soon as the client disconnects."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(until_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        task.cancel()  # no-op when done; otherwise the engine retires the request before its next step
    if not task.done() or task.cancelled():
        app.state.abandoned += 1
        return None
    return task.result()
