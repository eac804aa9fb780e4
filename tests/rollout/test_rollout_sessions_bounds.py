"""Open sessions are bounded by count, bytes and idle time, and an evicted session is an error episode with
its reason, never dropped silently (issue 47, item 7)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from rollout_fakes import FakeSampler

from agentrft.rollout.sessions import Session, SessionBook, call_bytes
from agentrft.rollout.stitch import Choice, SessionCall
from agentrft.types import Message

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from agentrft.rollout.serve import ServeLimits, create_app


def _call(index: int, n_ids: int) -> SessionCall:
    msg = Message(role="assistant", content="x")
    return SessionCall(
        index=index,
        messages=[Message(role="user", content="q" * 100)],
        rendered_messages=[],
        tools=[],
        rendered=list(range(n_ids)),
        prompt_ids=list(range(n_ids)),
        choices=[Choice(message=msg, token_ids=[1, 2], logprobs=[0.0, 0.0], rendered=[], finish_reason="stop")],
        policy_version=0,
        kind="first",
    )


class _Recorder:
    def __init__(self) -> None:
        self.evicted: list[tuple[str, int, str]] = []

    def __call__(self, session: Session, reason: str) -> None:
        self.evicted.append((session.id, len(session.calls), reason))


def test_count_bound_evicts_the_least_recently_used_and_says_why() -> None:
    rec = _Recorder()
    book = SessionBook(2, on_evict=rec)
    for sid in ("a", "b"):
        book.add(book.open(sid), _call(0, 10))
    book.open("a")  # a is used again: b is now the least recently used
    book.add(book.open("c"), _call(0, 10))
    assert book.ids() == ["a", "c"] and rec.evicted == [("b", 1, "the bound of 2 open sessions was reached")]
    assert book.evicted_reason("b") == "the bound of 2 open sessions was reached" and book.pop("b") is None


def test_byte_bound_counts_what_the_calls_hold() -> None:
    rec = _Recorder()
    one = call_bytes(_call(0, 1000))
    book = SessionBook(100, max_bytes=int(2.5 * one), on_evict=rec)
    for sid in ("a", "b"):
        book.add(book.open(sid), _call(0, 1000))
    assert book.bytes == 2 * one and rec.evicted == []
    book.add(book.open("c"), _call(0, 1000))  # 3 calls > 2.5: the oldest goes, with its call
    assert book.ids() == ["b", "c"] and book.bytes == 2 * one
    assert rec.evicted == [("a", 1, f"the open sessions held more than {int(2.5 * one):,} bytes")]
    book.pop("b")
    assert book.bytes == one


def test_idle_sessions_are_evicted_when_the_book_is_next_used(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _Recorder()
    book = SessionBook(100, idle_s=60, on_evict=rec)
    book.add(book.open("old"), _call(0, 5))
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + 61)
    book.open("new")
    assert book.ids() == ["new"] and rec.evicted == [("old", 1, "idle for more than 60 s")]


def test_the_server_records_an_evicted_session_as_an_error_episode() -> None:
    stored: list[Any] = []

    class Store:
        def add_trajectory(self, traj: Any) -> str:
            stored.append(traj)
            return traj.id

    app = create_app(FakeSampler(["1", "2", "3"]), store=Store(), limits=ServeLimits(max_sessions=1))
    c = TestClient(app)
    user = [{"role": "user", "content": "hi"}]
    assert c.post("/v1/sessions/s1/chat/completions", json={"messages": user}).status_code == 200
    assert c.post("/v1/sessions/s2/chat/completions", json={"messages": user}).status_code == 200
    (traj,) = stored  # s1 went when s2 opened: recorded, with why
    assert traj.metadata["session_id"] == "s1" and traj.status == "error"
    assert traj.error == "session evicted: the bound of 1 open sessions was reached"
    assert traj.untrainable_reason() == "episode_error"
