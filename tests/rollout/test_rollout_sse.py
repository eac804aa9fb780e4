"""`stream: true` and `n > 1` on `agentrft serve`: the chunks reassemble to the non-streamed response for a
fixed seed (tiny in-process model), tool calls stream in OpenAI's shape, and each choice is recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from rollout_fakes import TOOLS, FakeSampler

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from agentrft.rollout.serve import create_app
from agentrft.rollout.sessions import SessionBook
from agentrft.rollout.sse import content_pieces
from agentrft.types import Trajectory

USER = [{"role": "user", "content": "What is 5829 minus 5735?"}]


class ListStore:
    def __init__(self) -> None:
        self.trajs: list[Trajectory] = []

    def add_trajectory(self, traj: Trajectory) -> str:
        self.trajs.append(traj)
        return traj.id


def events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, `[DONE]` as the string."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def reassemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """What an OpenAI client builds from the chunks: per choice the message and finish reason; the usage."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        usage = chunk.get("usage", usage)
        for c in chunk["choices"]:
            slot = choices.setdefault(c["index"], {"message": {}, "finish_reason": None})
            msg, delta = slot["message"], c["delta"]
            if "role" in delta:
                msg["role"] = delta["role"]
            if delta.get("content") is not None:
                msg["content"] = msg.get("content", "") + delta["content"]
            for tc in delta.get("tool_calls", []):
                calls = msg.setdefault("tool_calls", [])
                if tc["index"] == len(calls):
                    calls.append({"id": tc["id"], "type": tc["type"], "function": {"name": "", "arguments": ""}})
                fn = calls[tc["index"]]["function"]
                fn["name"] += tc.get("function", {}).get("name", "")
                fn["arguments"] += tc.get("function", {}).get("arguments", "")
            if c["finish_reason"] is not None:
                slot["finish_reason"] = c["finish_reason"]
    for slot in choices.values():  # OpenAI sends no content key for a tool-call-only message
        if slot["message"].get("content") == "" and slot["message"].get("tool_calls"):
            del slot["message"]["content"]
    return {"choices": [{"index": i, **choices[i]} for i in sorted(choices)], "usage": usage}


def stream(c: TestClient, body: dict[str, Any]) -> list[Any]:
    with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return events(r.read().decode())


@pytest.fixture(scope="module")
def tiny() -> Iterator[Any]:
    from agentrft.samplers.policies import load_policy

    sampler = load_policy("tiny")
    yield sampler
    sampler.close()


def test_streamed_chunks_reassemble_to_the_non_streamed_response_for_a_fixed_seed(tiny: Any) -> None:
    store = ListStore()
    c = TestClient(create_app(tiny, store=store), raise_server_exceptions=False)
    body = {"messages": USER, "seed": 1234, "temperature": 1.0, "max_tokens": 12, "n": 2}
    plain = c.post("/v1/chat/completions", json=body).json()
    got = stream(c, {**body, "stream_options": {"include_usage": True}})
    assert got[-1] == "[DONE]"
    chunks = got[:-1]
    assert {ch["id"] for ch in chunks} == {chunks[0]["id"]} and chunks[-1]["choices"] == []
    rebuilt = reassemble(chunks)
    assert rebuilt["choices"] == [
        {"index": ch["index"], "message": ch["message"], "finish_reason": ch["finish_reason"]}
        for ch in plain["choices"]
    ]
    assert rebuilt["usage"] == plain["usage"]
    texts = [ch["message"]["content"] for ch in plain["choices"]]
    assert len(texts) == 2 and texts[0] != texts[1]  # choice i samples with seed + i
    one = c.post("/v1/chat/completions", json={**body, "n": 1}).json()
    assert one["choices"][0]["message"] == plain["choices"][0]["message"]
    # recorded the same way streamed or not: one trajectory per choice, with its token ids
    assert len(store.trajs) == 2 + 2 + 1
    assert [t.messages[-1].content for t in store.trajs[:2]] == texts
    assert [t.tokens.ids for t in store.trajs[:2]] == [t.tokens.ids for t in store.trajs[2:4]]


def test_streamed_tool_calls_reassemble_and_n_choices_each_join_a_session() -> None:
    a, b = "Let me see <calculate>5829 - 5735</calculate>", "Let me check <calculate>5829 - 5735</calculate>"
    sampler = FakeSampler([a, b, a, b, "94"])
    book = SessionBook()
    c = TestClient(create_app(sampler, sessions=book), raise_server_exceptions=False)
    body = {"messages": USER, "tools": TOOLS, "n": 2}
    plain = c.post("/v1/sessions/s/chat/completions", json=body).json()
    with c.stream("POST", "/v1/sessions/s/chat/completions", json={**body, "stream": True}) as r:
        chunks = events(r.read().decode())[:-1]
    rebuilt = reassemble(chunks)
    assert [ch["message"]["content"] for ch in plain["choices"]] == ["Let me see", "Let me check"]
    for got, want in zip(rebuilt["choices"], plain["choices"], strict=True):
        assert got["finish_reason"] == want["finish_reason"] == "tool_calls"
        assert got["message"]["content"] == want["message"]["content"]
        assert [tc["function"] for tc in got["message"]["tool_calls"]] == [
            tc["function"] for tc in want["message"]["tool_calls"]
        ]
    # the client goes on with the second choice of the streamed request: the session follows it
    chosen = rebuilt["choices"][1]["message"]
    follow = [*USER, chosen, {"role": "tool", "tool_call_id": chosen["tool_calls"][0]["id"], "content": "94"}]
    c.post("/v1/sessions/s/chat/completions", json={"messages": follow, "tools": TOOLS})
    session = book.pop("s")
    assert session is not None
    assert [(k.kind, k.parent) for k in session.calls] == [("first", None), ("new_segment", None), ("reuse", (1, 1))]
    traj = session.trajectory(policy="p")
    tok = traj.tokens
    assert tok is not None and tok.num_segments == 2  # the first request's choices went nowhere: a segment
    assert [(b.request, b.reason) for b in tok.breaks] == [(1, "message_dropped")]  # a retry drops the reply
    last = session.calls[2]
    second = tok.ids[tok.segment_spans()[1][0] :]
    assert second == last.prompt_ids + last.choices[0].token_ids
    assert last.prompt_ids[: len(session.calls[1].sequence(1))] == session.calls[1].sequence(1)


def test_content_pieces_concatenate_back() -> None:
    for text in ["", "one", " lead and trail  ", "a\nb\n\n c", "   "]:
        assert "".join(content_pieces(text)) == text
