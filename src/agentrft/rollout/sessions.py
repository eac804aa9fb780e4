"""Sessions of `agentrft serve`: the requests of one episode, recorded in order and made a Trajectory.

A client names its session by the base URL ``/v1/sessions/{id}`` (what `agent_command` hands an
agent as ``OPENAI_BASE_URL``) or by the ``X-Agentrft-Session`` header. Each request of a session
is a `stitch.SessionCall`: the messages, the prompt ids the sampler consumed, each sampled choice
(ids, log-probs, reply) and the policy version that sampled it. `Session.trajectory` turns them
into one episode: the final conversation, a model-call event per request, the tool calls the
agent's requests carried (paired with the tool results it sent back), the stitched token record
(`stitch.token_record`) and the final answer, if the caller knows it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrft.rollout.stitch import SessionCall, segments, token_record
from agentrft.types import (
    EnvRef,
    Event,
    FinalAnswerEvent,
    Message,
    ModelCallEvent,
    Status,
    ToolCall,
    ToolCallEvent,
    Trajectory,
    new_id,
)

SESSION_HEADER = "x-agentrft-session"
SESSION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass
class Session:
    """One episode's requests, in the order they were served (a lock keeps them in that order)."""

    id: str
    calls: list[SessionCall] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    created_at: float = field(default_factory=time.time)
    trajectory_id: str = field(default_factory=new_id)
    last_used: float = field(default_factory=time.monotonic)
    bytes: int = 0  # what its calls hold (`call_bytes`)

    def trajectory(
        self,
        *,
        policy: str,
        run_id: str = "",
        task_id: str = "",
        group_id: str = "",
        env: EnvRef | None = None,
        final_answer: str | None = None,
        status: Status | None = None,
        error: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Trajectory:
        """The session as one episode. ``status`` defaults to ``truncated`` when the last reply ran into its
        token limit, else ``completed``; ``final_answer`` adds a `FinalAnswerEvent` (what graders read)."""
        calls = self.calls
        chosen = _chosen_choices(calls)
        messages: list[Message] = []
        if calls:
            last = calls[-1]
            messages = [m.model_copy(deep=True) for m in last.messages]
            messages.append(last.choices[chosen[last.index]].message.model_copy(deep=True))
        events: list[Event] = []
        for c in calls:
            events.append(
                ModelCallEvent(
                    t=c.created_at or time.time(),
                    turn=c.index,
                    latency_s=max(ch.latency_s for ch in c.choices),
                    prompt_tokens=len(c.prompt_ids),
                    completion_tokens=sum(len(ch.token_ids) for ch in c.choices),
                    finish_reason=c.choices[chosen[c.index]].finish_reason,
                )
            )
        events += _tool_call_events(calls, chosen)
        if final_answer is not None:
            events.append(FinalAnswerEvent(turn=calls[-1].index if calls else 0, text=final_answer))
        if status is None:
            truncated = bool(calls) and calls[-1].choices[chosen[calls[-1].index]].finish_reason == "length"
            status = "truncated" if truncated else "completed"
        tokens = token_record(calls)
        return Trajectory(
            id=self.trajectory_id,
            run_id=run_id,
            task_id=task_id or self.id,
            group_id=group_id,
            env=env or EnvRef(name="serve", version="1"),
            policy=policy,
            policy_version=calls[0].policy_version if calls else 0,
            messages=messages,
            n_prompt_messages=len(calls[0].messages) if calls else 0,
            events=events,
            tokens=tokens,
            status=status,
            error=error,
            created_at=self.created_at,
            finished_at=time.time(),
            metadata={
                "session_id": self.id,
                "requests": len(calls),
                "segments": 0 if tokens is None else tokens.num_segments,
                "request_kinds": [c.kind for c in calls],
                "policy_versions": [c.policy_version for c in calls],
                "tools": calls[0].tools if calls else [],
                **(metadata or {}),
            },
        )


def _chosen_choices(calls: list[SessionCall]) -> dict[int, int]:
    """Per call, the choice the episode went on with: the one a later request continued, else the first."""
    chosen = {c.index: 0 for c in calls}
    for seg in segments(calls):
        for call, j in seg.calls:
            chosen[call.index] = j
    return chosen


def _arguments(call: ToolCall) -> dict[str, Any] | str:
    try:
        value = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        return call.function.arguments
    return value if isinstance(value, dict) else call.function.arguments


def _tool_call_events(calls: list[SessionCall], chosen: dict[int, int]) -> list[ToolCallEvent]:
    """The tool calls of the episode: those of the replies the agent went on with, then any other assistant
    tool call its requests carried (not those of the first request's prompt: worked examples), each paired
    with the result a later request sent back in a tool message with its id."""
    if not calls:
        return []
    in_prompt = {tc.id for m in calls[0].messages for tc in m.tool_calls or []}
    found: dict[str, tuple[int, ToolCall]] = {}
    results: dict[str, str] = {}
    for c in calls:
        for m in c.messages:
            if m.role == "tool" and m.tool_call_id:
                results.setdefault(m.tool_call_id, m.text())
        for m in c.messages:
            for tc in m.tool_calls or []:
                if m.role == "assistant" and tc.id not in in_prompt and tc.id not in found:
                    found[tc.id] = (max(c.index - 1, 0), tc)
        for tc in c.choices[chosen[c.index]].message.tool_calls or []:
            found.setdefault(tc.id, (c.index, tc))
    events = []
    for call_id, (turn, tc) in sorted(found.items(), key=lambda kv: kv[1][0]):
        result = results.get(call_id)
        events.append(
            ToolCallEvent(
                turn=turn,
                call_id=call_id,
                name=tc.function.name,
                arguments=_arguments(tc),
                result=result,
                error=None if result is not None else "the agent sent back no result for this call",
                error_kind=None if result is not None else "no_result",
            )
        )
    return events


def call_bytes(call: SessionCall) -> int:
    """About what one served request holds while its session is open: its token ids (the prompt twice, as
    rendered and as consumed; each choice's ids and log-probs) and its messages' text (twice: as given and as
    rendered). An estimate that grows as the memory does, for the book's bound."""
    ids = len(call.rendered) + len(call.prompt_ids) + sum(2 * len(ch.token_ids) for ch in call.choices)
    text = sum(len(m.content) if isinstance(m.content, str) else 0 for m in call.messages)
    return 8 * ids + 2 * text


class SessionBook:
    """Open sessions by id, bounded three ways: how many (``max_sessions``), what they hold in all
    (``max_bytes``, by `call_bytes`) and how long one may sit idle (``idle_s``). Past a bound the least
    recently used session is evicted: never silently, ``on_evict(session, reason)`` hears of it (the server
    records it as an error episode with the reason), and `evicted_reason` answers for its id afterwards (an
    agent program's episode ends in that error)."""

    def __init__(
        self,
        max_sessions: int = 10_000,
        *,
        max_bytes: int = 1 << 30,
        idle_s: float = 3600.0,
        on_evict: Callable[[Session, str], None] | None = None,
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        if max_bytes < 1 or idle_s <= 0:
            raise ValueError(f"max_bytes and idle_s must be positive, got {max_bytes} and {idle_s}")
        self.max_sessions, self.max_bytes, self.idle_s = max_sessions, max_bytes, idle_s
        self.on_evict = on_evict
        self._open: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._reasons: OrderedDict[str, str] = OrderedDict()  # evicted ids -> why (the latest max_sessions)
        self.bytes = 0
        self.evicted = 0

    def open(self, session_id: str) -> Session:
        """The session with this id (started on first use), now the most recently used."""
        self._evict_idle(exempt=session_id)
        session = self._open.get(session_id)
        if session is None:
            session = self._open[session_id] = Session(session_id)
            self._reasons.pop(session_id, None)
            while len(self._open) > self.max_sessions:
                self._evict_oldest(f"the bound of {self.max_sessions:,} open sessions was reached")
        self._open.move_to_end(session_id)
        session.last_used = time.monotonic()
        return session

    def add(self, session: Session, call: SessionCall) -> None:
        """Record a served request in its session; older sessions go while the book holds more than max_bytes."""
        size = call_bytes(call)
        session.calls.append(call)
        session.bytes += size
        if self._open.get(session.id) is session:
            self.bytes += size
        while self.bytes > self.max_bytes and len(self._open) > 1 and next(iter(self._open)) != session.id:
            self._evict_oldest(f"the open sessions held more than {self.max_bytes:,} bytes")

    def get(self, session_id: str) -> Session | None:
        return self._open.get(session_id)

    def pop(self, session_id: str) -> Session | None:
        """Forget the session and return it (None if it never served a request, or was evicted)."""
        session = self._open.pop(session_id, None)
        if session is not None:
            self.bytes -= session.bytes
        return session

    def evicted_reason(self, session_id: str) -> str | None:
        """Why the session with this id was evicted, if it was (and has not been opened again since)."""
        return self._reasons.get(session_id)

    def ids(self) -> list[str]:
        return list(self._open)

    def _evict_idle(self, exempt: str) -> None:
        cutoff = time.monotonic() - self.idle_s
        while self._open:
            sid, oldest = next(iter(self._open.items()))
            if sid == exempt or oldest.last_used > cutoff:
                return
            self._evict(sid, f"idle for more than {self.idle_s:g} s")

    def _evict_oldest(self, reason: str) -> None:
        self._evict(next(iter(self._open)), reason)

    def _evict(self, session_id: str, reason: str) -> None:
        session = self.pop(session_id)
        self.evicted += 1
        self._reasons[session_id] = reason
        while len(self._reasons) > self.max_sessions:
            self._reasons.popitem(last=False)
        if session is not None and self.on_evict is not None:
            self.on_evict(session, reason)
