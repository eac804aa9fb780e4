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
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from agentrft.rollout.agent import to_render
from agentrft.rollout.formats import make_format
from agentrft.rollout.serve_record import Prepared, conversation_id, request_trajectory
from agentrft.rollout.serve_request import (
    ApiError,
    ChatRequest,
    ServeLimits,
    describe_errors,
    first_line,
    one_line,
    parse_chat_request,
    read_body,
    requested_max_tokens,
    until_disconnected,
)
from agentrft.rollout.sessions import SESSION_HEADER, SESSION_ID, Session, SessionBook
from agentrft.rollout.sse import completion_chunks
from agentrft.rollout.stitch import Choice, Plan, SessionCall, plan_prompt
from agentrft.rollout.tito import DeltaRenderer
from agentrft.samplers.base import SampleRequest, SampleResult, SamplingParams, TokenSampler
from agentrft.types import Message, Trajectory, new_id

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
    still running when shutdown's grace ended), and lists ``store_errors``."""
    limits = limits or ServeLimits()
    if api_key is not None and not api_key:
        raise ValueError("api_key is empty: it would let every client in")
    make_format(tool_format, [])  # fail at start-up, not per request, on an unknown format
    own_sessions = sessions is None

    def _evicted(session: Session, reason: str) -> None:  # never dropped silently: an error episode, with why
        if session.calls:
            traj = session.trajectory(
                policy=sampler.policy,
                run_id=run_id,
                group_id=session.id,
                status="error",
                error=f"session evicted: {reason}",
            )
            _store(traj, f"session {session.id}")

    book = sessions if sessions is not None else limits.session_book(on_evict=_evicted)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if own_sessions:  # what the clients never ended is still an episode
            for sid in book.ids():
                _end_session(sid)

    app = FastAPI(title="agentrft serve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.recorded = 0
    app.state.abandoned = 0
    app.state.ignored_seeds = 0
    app.state.store_errors = []
    app.state.sessions = book

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

    def _check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise ApiError(
                401, "missing or invalid API key (send 'Authorization: Bearer <key>')", code="invalid_api_key"
            )

    def _session_id(value: str, where: str) -> str:
        if not SESSION_ID.fullmatch(value):
            raise ApiError(
                400, f"{where}: a session id is 1-128 characters of A-Z a-z 0-9 . _ : -", code="invalid_session_id"
            )
        return value

    def _models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": sampler.policy, "object": "model", "created": 0, "owned_by": "agentrft"}],
        }

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _check_key(request)
        return _models()

    @app.get("/v1/sessions/{session_id}/models")
    async def session_models(request: Request, session_id: str) -> dict[str, Any]:
        _check_key(request)
        return _models()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        _check_key(request)  # before the header: a client without the key learns nothing of sessions
        header = request.headers.get(SESSION_HEADER)
        sid = None if header is None else _session_id(header, "X-Agentrft-Session")
        return await _chat(request, sid)

    @app.post("/v1/sessions/{session_id}/chat/completions")
    async def session_chat_completions(request: Request, session_id: str) -> Response:
        return await _chat(request, _session_id(session_id, "session id"))

    @app.post("/v1/sessions/{session_id}/end")
    async def end_session(request: Request, session_id: str) -> dict[str, Any]:
        _check_key(request)
        if not own_sessions:
            raise ApiError(400, "this server's sessions are ended by the process that runs them")
        traj = _end_session(_session_id(session_id, "session id"))
        if traj is None:
            raise ApiError(404, f"no open session {session_id!r}", code="session_not_found")
        segments = traj.tokens.num_segments if traj.tokens is not None else 0
        return {"id": traj.id, "session_id": session_id, "requests": traj.metadata["requests"], "segments": segments}

    def _end_session(sid: str) -> Trajectory | None:
        session = book.pop(sid)
        if session is None or not session.calls:
            return None
        traj = session.trajectory(policy=sampler.policy, run_id=run_id, group_id=sid)
        _store(traj, f"session {sid}")
        return traj

    async def _chat(request: Request, sid: str | None) -> Response:
        try:
            _check_key(request)
            try:
                raw = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
            except ClientDisconnect:  # a half-sent body: the client is gone; nobody reads an answer, no traceback
                app.state.abandoned += 1
                return Response(status_code=499)
            req = await asyncio.to_thread(parse_chat_request, raw, limits)
            result = await _unless_client_leaves(request, _complete(req, sid))
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

    async def _unless_client_leaves(request: Request, work: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
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

    def _prepare(req: ChatRequest) -> Prepared:
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
        rendered = [to_render(m, fmt) for m in messages]
        try:
            prompt_ids = list(sampler.render(rendered, tools if fmt.native else None, True))
        except Exception as exc:  # the template's own checks (e.g. roles must alternate) on client input
            raise ApiError(
                400,
                f"messages: the chat template cannot render this conversation: {first_line(exc)}",
                param="messages",
            ) from None
        return Prepared(messages, rendered, fmt, tools, prompt_ids, conversation_id(req.messages))

    def _plan(session: Session, prep: Prepared) -> Plan:
        """How the request joins its session (`stitch.plan_prompt`): CPU-bound, run off the event loop."""
        delta = DeltaRenderer(sampler, prep.tools if prep.fmt.native else None)
        return plan_prompt(session.calls, prep.rendered_messages, prep.tools, prep.prompt_ids, delta.delta)

    def _max_tokens(req: ChatRequest, n_prompt: int) -> int:
        """What to ask the sampler for: the client's max_tokens if prompt + it fit the context, else 400;
        without one, the server default cut to the room the prompt leaves."""
        asked, param = requested_max_tokens(req, limits)
        if sampling is not None:
            asked = min(asked or sampling.max_tokens, sampling.max_tokens)
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

    async def _complete(req: ChatRequest, sid: str | None) -> dict[str, Any]:
        prep = await asyncio.to_thread(_prepare, req)
        if sid is None:
            return await _sample(req, prep, prep.prompt_ids, None)
        session = book.open(sid)
        async with session.lock:  # a session's requests are stitched in the order they are served
            if len(session.calls) >= limits.max_session_requests:
                raise ApiError(
                    400,
                    f"session {sid!r} has made {len(session.calls)} requests, the most one session may make",
                    code="session_too_long",
                )
            plan = await asyncio.to_thread(_plan, session, prep)
            return await _sample(req, prep, plan.prompt_ids, (session, plan))

    def _params(req: ChatRequest, n_prompt: int, calls_tools: bool, prep: Prepared) -> SamplingParams:
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if calls_tools:
            stops += prep.fmt.stop_strings()
        seed = req.seed
        if sampling is not None:
            temperature, top_p, top_k = sampling.temperature, sampling.top_p, sampling.top_k
            if seed is not None:
                app.state.ignored_seeds += 1
                seed = None
        else:
            temperature = 1.0 if req.temperature is None else req.temperature
            top_p, top_k = (1.0 if req.top_p is None else req.top_p), None
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            max_tokens=_max_tokens(req, n_prompt),
            stop=list(dict.fromkeys(stops)),
        )

    async def _sample(
        req: ChatRequest, prep: Prepared, prompt_ids: list[int], in_session: tuple[Session, Plan] | None
    ) -> dict[str, Any]:
        calls_tools = bool(prep.tools) and req.tool_choice != "none"
        params = _params(req, len(prompt_ids), calls_tools, prep)
        n = req.n or 1
        seeds = [None if params.seed is None else params.seed + i for i in range(n)]
        t0 = time.time()
        version = sampler.policy_version
        try:
            results = await asyncio.gather(
                *(
                    sampler.sample(
                        SampleRequest(
                            prompt_ids=prompt_ids,
                            params=params.model_copy(update={"seed": seed}),
                            group_key=prep.conversation_id,
                        )
                    )
                    for seed in seeds
                )
            )
        except ValueError as exc:  # the sampler's own request checks (e.g. prompt longer than the context)
            raise ApiError(400, one_line(str(exc))) from None
        except Exception as exc:
            raise ApiError(500, f"policy failed: {first_line(exc)}", type_="server_error") from None
        replies = [_reply(prep, result, calls_tools) for result in results]
        completion_id = f"chatcmpl-{new_id()}"
        if in_session is not None:
            session, plan = in_session
            book.add(
                session,
                SessionCall(
                    index=len(session.calls),
                    messages=prep.messages,
                    rendered_messages=prep.rendered_messages,
                    tools=prep.tools,
                    rendered=prep.prompt_ids,
                    prompt_ids=list(prompt_ids),
                    choices=[
                        Choice(
                            message=message,
                            token_ids=list(result.token_ids),
                            logprobs=[float(x) for x in result.logprobs],
                            rendered=to_render(message, prep.fmt),
                            finish_reason=result.finish_reason,
                            latency_s=result.latency_s,
                        )
                        for result, (message, _) in zip(results, replies, strict=True)
                    ],
                    policy_version=version,
                    kind=plan.kind,
                    parent=plan.parent,
                    split=plan.split,
                    created_at=t0,
                ),
            )
        else:
            for result, (message, _) in zip(results, replies, strict=True):
                _record(prep, prompt_ids, message, result, completion_id, t0)
        prompt_tokens = len(prompt_ids)
        completion_tokens = sum(r.completion_tokens for r in results)
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(t0),
            "model": sampler.policy,
            "choices": [
                {"index": i, "message": message.to_openai(), "finish_reason": finish, "logprobs": None}
                for i, (message, finish) in enumerate(replies)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _reply(prep: Prepared, result: SampleResult, calls_tools: bool) -> tuple[Message, str]:
        """The assistant message of a sampled result and its finish reason (calls in the text become tool_calls)."""
        parsed = prep.fmt.parse(result.text) if calls_tools else None
        if parsed is not None and parsed.tool_calls:
            return Message(role="assistant", content=parsed.content or None, tool_calls=parsed.tool_calls), "tool_calls"
        return Message(role="assistant", content=result.text), "length" if result.finish_reason == "length" else "stop"

    def _record(
        prep: Prepared, prompt_ids: list[int], reply: Message, result: SampleResult, completion_id: str, t0: float
    ) -> None:
        # Synchronous on purpose: a cancellation (shutdown, disconnect) cannot land between the
        # sampler's answer and the store's commit, so what finished is recorded whole or not at all.
        if store is not None:
            traj = request_trajectory(
                prep,
                prompt_ids,
                reply,
                result,
                completion_id,
                t0,
                sampler=sampler,
                run_id=run_id,
                tool_format=tool_format,
            )
            _store(traj, completion_id)

    def _store(traj: Trajectory, what: str) -> None:
        if store is None:
            return
        try:
            store.add_trajectory(traj)
            app.state.recorded += 1
        except Exception as exc:
            app.state.store_errors.append(f"{what}: {first_line(exc)}")

    return app
