"""The chat completions behind `serve.create_app` (the routes and the HTTP plumbing are there): a request
prepared (tools into the prompt, chat template, tokenizer), planned into its session (`stitch.plan_prompt`),
sampled, answered in the OpenAI shape and recorded. One `ChatService` per app; its counters (``recorded``,
``abandoned``, ``ignored_seeds``, ``store_errors``) live on the app's state, which the routes share."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agentrft.rollout.agent import to_render
from agentrft.rollout.formats import make_format
from agentrft.rollout.serve_record import Prepared, conversation_id, request_trajectory
from agentrft.rollout.serve_request import (
    ApiError,
    ChatRequest,
    ServeLimits,
    first_line,
    one_line,
    requested_max_tokens,
)
from agentrft.rollout.sessions import Session, SessionBook
from agentrft.rollout.stitch import Choice, Plan, SessionCall, plan_prompt
from agentrft.rollout.tito import DeltaRenderer
from agentrft.samplers.base import SampleRequest, SampleResult, SamplingParams, TokenSampler
from agentrft.types import Message, Trajectory, new_id


class ChatService:
    """Completions over ``sampler``, recorded in ``store`` (see `serve.create_app` for the parameters)."""

    def __init__(
        self,
        sampler: TokenSampler,
        state: Any,
        *,
        store: Any,
        tool_format: str,
        run_id: str,
        limits: ServeLimits,
        sessions: SessionBook | None,
        sampling: SamplingParams | None,
    ) -> None:
        make_format(tool_format, [])  # fail at start-up, not per request, on an unknown format
        self.sampler, self.state, self.store = sampler, state, store
        self.tool_format, self.run_id, self.limits, self.sampling = tool_format, run_id, limits, sampling
        self.own_sessions = sessions is None
        self.book = sessions if sessions is not None else limits.session_book(on_evict=self.evicted)
        state.recorded, state.abandoned, state.ignored_seeds, state.store_errors = 0, 0, 0, []
        state.sessions = self.book

    # ------------------------------------------------------------------ sessions

    def evicted(self, session: Session, reason: str) -> None:
        """An evicted session is never dropped silently: it is recorded as an error episode, with why."""
        if session.calls:
            traj = session.trajectory(
                policy=self.sampler.policy,
                run_id=self.run_id,
                group_id=session.id,
                status="error",
                error=f"session evicted: {reason}",
            )
            self.store_trajectory(traj, f"session {session.id}")

    def end_session(self, sid: str) -> Trajectory | None:
        """Record session ``sid`` as one stitched episode and forget it (None: no such session, or empty)."""
        session = self.book.pop(sid)
        if session is None or not session.calls:
            return None
        traj = session.trajectory(policy=self.sampler.policy, run_id=self.run_id, group_id=sid)
        self.store_trajectory(traj, f"session {sid}")
        return traj

    # ------------------------------------------------------------------ a completion

    async def complete(self, req: ChatRequest, sid: str | None) -> dict[str, Any]:
        """The completion of ``req`` (in session ``sid``, stitched in the order they are served)."""
        prep = await asyncio.to_thread(self.prepare, req)
        if sid is None:
            return await self.sample(req, prep, prep.prompt_ids, None)
        session = self.book.open(sid)
        async with session.lock:
            if len(session.calls) >= self.limits.max_session_requests:
                raise ApiError(
                    400,
                    f"session {sid!r} has made {len(session.calls)} requests, the most one session may make",
                    code="session_too_long",
                )
            plan = await asyncio.to_thread(self.plan, session, prep)
            return await self.sample(req, prep, plan.prompt_ids, (session, plan))

    def prepare(self, req: ChatRequest) -> Prepared:
        """Tools into the prompt, then the chat template and tokenizer: CPU-bound, run off the event loop."""
        tools = req.tool_dicts()
        fmt = make_format(self.tool_format, tools)
        messages = [m.model_copy(deep=True) for m in req.messages]
        instructions = fmt.render_tool_instructions(tools) if tools else ""
        if instructions:
            if messages[0].role in ("system", "developer"):
                messages[0].content = f"{messages[0].text()}\n\n{instructions}".strip()
            else:
                messages.insert(0, Message(role="system", content=instructions))
        rendered = [to_render(m, fmt) for m in messages]
        try:
            prompt_ids = list(self.sampler.render(rendered, tools if fmt.native else None, True))
        except Exception as exc:  # the template's own checks (e.g. roles must alternate) on client input
            raise ApiError(
                400,
                f"messages: the chat template cannot render this conversation: {first_line(exc)}",
                param="messages",
            ) from None
        return Prepared(messages, rendered, fmt, tools, prompt_ids, conversation_id(req.messages))

    def plan(self, session: Session, prep: Prepared) -> Plan:
        """How the request joins its session (`stitch.plan_prompt`): CPU-bound, run off the event loop."""
        delta = DeltaRenderer(self.sampler, prep.tools if prep.fmt.native else None)
        return plan_prompt(session.calls, prep.rendered_messages, prep.tools, prep.prompt_ids, delta.delta)

    def max_tokens(self, req: ChatRequest, n_prompt: int) -> int:
        """What to ask the sampler for: the client's max_tokens if prompt + it fit the context, else 400;
        without one, the server default cut to the room the prompt leaves."""
        limits = self.limits
        asked, param = requested_max_tokens(req, limits)
        if self.sampling is not None:
            asked = min(asked or self.sampling.max_tokens, self.sampling.max_tokens)
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

    def params(self, req: ChatRequest, n_prompt: int, calls_tools: bool, prep: Prepared) -> SamplingParams:
        """The request's sampling parameters; under the run's ``sampling`` its distribution, no client seed."""
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if calls_tools:
            stops += prep.fmt.stop_strings()
        seed = req.seed
        if self.sampling is not None:
            temperature, top_p, top_k = self.sampling.temperature, self.sampling.top_p, self.sampling.top_k
            if seed is not None:
                self.state.ignored_seeds += 1
                seed = None
        else:
            temperature = 1.0 if req.temperature is None else req.temperature
            top_p, top_k = (1.0 if req.top_p is None else req.top_p), None
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            max_tokens=self.max_tokens(req, n_prompt),
            stop=list(dict.fromkeys(stops)),
        )

    async def sample(
        self, req: ChatRequest, prep: Prepared, prompt_ids: list[int], in_session: tuple[Session, Plan] | None
    ) -> dict[str, Any]:
        """Sample ``n`` choices (choice i with seed + i), record them (a request's own trajectory, or a call of
        its session), and answer in the OpenAI shape."""
        calls_tools = bool(prep.tools) and req.tool_choice != "none"
        params = self.params(req, len(prompt_ids), calls_tools, prep)
        seeds = [None if params.seed is None else params.seed + i for i in range(req.n or 1)]
        t0 = time.time()
        version = self.sampler.policy_version
        try:
            results = await asyncio.gather(
                *(
                    self.sampler.sample(
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
        replies = [self.reply(prep, result, calls_tools) for result in results]
        completion_id = f"chatcmpl-{new_id()}"
        if in_session is not None:
            session, plan = in_session
            self.book.add(session, _session_call(session, plan, prep, prompt_ids, results, replies, version, t0))
        else:
            for result, (message, _) in zip(results, replies, strict=True):
                self.record(prep, prompt_ids, message, result, completion_id, t0)
        return self.response(completion_id, t0, len(prompt_ids), results, replies)

    def reply(self, prep: Prepared, result: SampleResult, calls_tools: bool) -> tuple[Message, str]:
        """The assistant message of a sampled result and its finish reason (calls in the text become tool_calls)."""
        parsed = prep.fmt.parse(result.text) if calls_tools else None
        if parsed is not None and parsed.tool_calls:
            return Message(role="assistant", content=parsed.content or None, tool_calls=parsed.tool_calls), "tool_calls"
        return Message(role="assistant", content=result.text), "length" if result.finish_reason == "length" else "stop"

    def response(
        self,
        completion_id: str,
        t0: float,
        prompt_tokens: int,
        results: list[SampleResult],
        replies: list[tuple[Message, str]],
    ) -> dict[str, Any]:
        completion_tokens = sum(r.completion_tokens for r in results)
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(t0),
            "model": self.sampler.policy,
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

    # ------------------------------------------------------------------ recording

    def record(
        self,
        prep: Prepared,
        prompt_ids: list[int],
        reply: Message,
        result: SampleResult,
        completion_id: str,
        t0: float,
    ) -> None:
        # Synchronous on purpose: a cancellation (shutdown, disconnect) cannot land between the
        # sampler's answer and the store's commit, so what finished is recorded whole or not at all.
        if self.store is not None:
            traj = request_trajectory(
                prep,
                prompt_ids,
                reply,
                result,
                completion_id,
                t0,
                sampler=self.sampler,
                run_id=self.run_id,
                tool_format=self.tool_format,
            )
            self.store_trajectory(traj, completion_id)

    def store_trajectory(self, traj: Trajectory, what: str) -> None:
        if self.store is None:
            return
        try:
            self.store.add_trajectory(traj)
            self.state.recorded += 1
        except Exception as exc:
            self.state.store_errors.append(f"{what}: {first_line(exc)}")


def _session_call(
    session: Session,
    plan: Plan,
    prep: Prepared,
    prompt_ids: list[int],
    results: list[SampleResult],
    replies: list[tuple[Message, str]],
    version: int,
    t0: float,
) -> SessionCall:
    """One served request of a session, as `stitch` joins it to the episode."""
    return SessionCall(
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
    )
