"""Sessions of `agentrft serve` stitched into one episode: token-exact, split where the client or the
template rewrote history, with the reason; never re-tokenised.

The fake sampler tokenises what it samples differently from the chat template ("calculate" is one
id when sampled, nine when rendered), so a record built by re-rendering the conversation could not
equal the in-process agent loop's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from rollout_fakes import FakeEnv, FakeSampler, chatml, decode, rewriting, task

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from agentrft.graders import agrade_trajectory, load_grader
from agentrft.rollout.agent import run_episode
from agentrft.rollout.serve import create_app
from agentrft.rollout.sessions import SessionBook
from agentrft.rollout.stitch import token_record
from agentrft.samplers.base import SamplingParams
from agentrft.types import TokenRecord, Trajectory

SCRIPT = ["Let me see <calculate>5829 - 5735</calculate>", "<calculate>94 * 2</calculate>", "The answer is 188"]


def serve(sampler: FakeSampler) -> tuple[TestClient, SessionBook]:
    book = SessionBook()
    return TestClient(create_app(sampler, sessions=book), raise_server_exceptions=False), book


def post(c: TestClient, sid: str, messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    r = c.post(f"/v1/sessions/{sid}/chat/completions", json={"messages": messages, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def sampled_ids(sampler: FakeSampler) -> list[int]:
    return [i for r in sampler.results for i in r.token_ids]


def test_a_session_stitches_to_the_in_process_agent_loops_token_record() -> None:
    env, t = FakeEnv(few_shot=True), task()
    loop_traj = asyncio.run(
        run_episode(env, FakeSampler(list(SCRIPT)), t, params=SamplingParams(max_tokens=200), tool_format="xml")
    )
    assert loop_traj.status == "completed" and loop_traj.tokens is not None

    # The same conversation from a client with its own tool loop: it sends the env's messages and tools,
    # runs the calls it gets back (the results the loop's tools gave) and sends everything back as received.
    sampler = FakeSampler(list(SCRIPT))
    traj = play_session(sampler, env, t, loop_traj)

    assert traj.tokens == loop_traj.tokens  # ids, loss mask, log-probs and turns, token for token
    assert traj.tokens.num_segments == 1 and traj.metadata["request_kinds"] == ["first", "reuse", "reuse"]
    assert sampler.prompts == turn_prompts(loop_traj)
    # the ids the model sampled are kept: re-rendering "calculate" would give nine other ids
    assert [i for i, m in zip(traj.tokens.ids, traj.tokens.loss_mask, strict=True) if m] == sampled_ids(sampler)
    assert 900 in traj.tokens.ids
    # the episode as graders see it: the final answer, and the tool calls the agent's requests carried
    assert [(e.name, e.arguments, e.result) for e in traj.tool_calls] == [
        ("calculate", {"expression": "5829 - 5735"}, "94"),
        ("calculate", {"expression": "94 * 2"}, "188"),
    ]
    grader = load_grader(
        {
            "type": "multi",
            "graders": {
                "answer": {"type": "numeric", "input": "{{ sample.output_text }}", "reference": "188"},
                "calc": {"type": "tool_called", "tool": "calculate", "min_calls": 2},
            },
            "calculate_output": "answer * calc",
        }
    )
    grade = asyncio.run(agrade_trajectory(grader, traj, {}))
    assert grade.errors == [] and grade.reward == 1.0 and grade.success


def play_session(sampler: FakeSampler, env: FakeEnv, t: Any, loop_traj: Trajectory) -> Trajectory:
    """The in-process episode's conversation played by a client with its own tool loop through a served
    session: it sends the env's messages and tools, answers each call with the result the loop's tools gave,
    and sends everything back as received. The session's trajectory."""
    c, book = serve(sampler)
    results = [m.text() for m in loop_traj.messages[loop_traj.n_prompt_messages :] if m.role == "tool"]
    messages = [m.to_openai() for m in env.initial_messages(t)]
    while True:
        reply = post(c, "ep-1", messages, tools=env.tool_schemas(), max_tokens=200)
        messages.append(reply)
        if not reply.get("tool_calls"):
            break
        for call in reply["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": results.pop(0)})
    session = book.pop("ep-1")
    assert session is not None
    return session.trajectory(policy=sampler.policy, task_id=t.id, final_answer=reply["content"])


def turn_prompts(traj: Trajectory) -> list[list[int]]:
    """The prompt of each turn of an in-process episode: its token record up to that turn's sampled ids."""
    tok = traj.tokens
    assert tok is not None
    starts = [i for i in range(len(tok.ids)) if tok.loss_mask[i] and (i == 0 or not tok.loss_mask[i - 1])]
    return [tok.ids[:s] for s in starts]


def _segments(tok: TokenRecord) -> list[list[int]]:
    return [tok.ids[a:b] for a, b in tok.segment_spans()]


def test_a_template_that_rewrites_earlier_turns_splits_the_episode_and_retokenises_nothing() -> None:
    # Like Qwen3: reasoning is dropped from every assistant turn but the last, so once a second
    # assistant turn follows, the first renders differently from what the model saw.
    outputs = ["<think>a</think><calculate>1 + 1</calculate>", "<think>b</think><calculate>2 + 2</calculate>", "4"]
    sampler = FakeSampler(outputs, template=rewriting)
    c, book = serve(sampler)
    tools = FakeEnv().tool_schemas()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    for result in ["2", "4", None]:
        reply = post(c, "s", messages, tools=tools)
        messages.append(reply)
        if result is not None:
            messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": result})
    session = book.pop("s")
    assert session is not None
    tok = session.trajectory(policy="p").tokens
    assert tok is not None and tok.num_segments == 2
    (brk,) = tok.breaks
    assert (brk.segment, brk.request, brk.reason) == (1, 2, "template_rewrote_history")
    # each segment is exactly what the sampler consumed, then what it sampled
    first, second = _segments(tok)
    assert first == sampler.prompts[1] + sampler.results[1].token_ids
    assert second == sampler.prompts[2] + sampler.results[2].token_ids
    assert "<think>a</think>" not in decode(second) and "<think>b</think>" in decode(second)
    # the loss is on the sampled ids alone, each once, in order
    assert [i for i, m in zip(tok.ids, tok.loss_mask, strict=True) if m] == sampled_ids(sampler)
    assert tok.turn[: len(first)][-1] == 1 and set(tok.turn[len(first) :]) == {2}
    assert session.calls[1].kind == "reuse" and session.calls[2].kind == "new_segment"


def test_a_client_that_drops_a_message_starts_a_new_segment() -> None:
    sampler = FakeSampler(["<calculate>1 + 1</calculate>", "<calculate>2 + 2</calculate>", "4"], template=chatml)
    c, book = serve(sampler)
    tools = FakeEnv().tool_schemas()
    head: list[dict[str, Any]] = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    r1 = post(c, "s", head, tools=tools)
    turn1 = [r1, {"role": "tool", "tool_call_id": r1["tool_calls"][0]["id"], "content": "2"}]
    r2 = post(c, "s", [*head, *turn1], tools=tools)
    turn2 = [r2, {"role": "tool", "tool_call_id": r2["tool_calls"][0]["id"], "content": "4"}]
    post(c, "s", [*head, *turn2], tools=tools)  # the first exchange is left out
    session = book.pop("s")
    assert session is not None
    traj = session.trajectory(policy="p", final_answer="4")
    tok = traj.tokens
    assert tok is not None and [b.reason for b in tok.breaks] == ["message_dropped"]
    assert "message 2" in tok.breaks[0].detail
    assert _segments(tok)[1] == sampler.prompts[2] + sampler.results[2].token_ids
    # both calls count for tool-use graders, with their results
    assert [(e.arguments, e.result) for e in traj.tool_calls] == [
        ({"expression": "1 + 1"}, "2"),
        ({"expression": "2 + 2"}, "4"),
    ]


def test_a_request_whose_rendering_extends_the_session_appends_the_templates_ids() -> None:
    # The reply is sent back as sampled and tokenises the same: the full rendering extends the record.
    sampler = FakeSampler(["hello", "bye"], template=chatml)
    c, book = serve(sampler)
    first = [{"role": "user", "content": "hi"}]
    r1 = post(c, "s", first)
    second = [*first, r1, {"role": "user", "content": "again"}]
    post(c, "s", second)
    session = book.pop("s")
    assert session is not None and [k.kind for k in session.calls] == ["first", "extend"]
    tok = token_record(session.calls)
    assert tok is not None and tok.num_segments == 1
    assert tok.ids == sampler.prompts[1] + sampler.results[1].token_ids
    assert tok.turn == [0] * (len(sampler.prompts[0]) + len(sampler.results[0].token_ids)) + [1] * (
        len(tok.ids) - len(sampler.prompts[0]) - len(sampler.results[0].token_ids)
    )


def test_session_header_names_the_session_and_bad_ids_are_400() -> None:
    sampler = FakeSampler(["a", "b"])
    c, book = serve(sampler)
    msgs = [{"role": "user", "content": "hi"}]
    r = c.post("/v1/chat/completions", json={"messages": msgs}, headers={"X-Agentrft-Session": "run-7.a:b"})
    assert r.status_code == 200 and book.get("run-7.a:b") is not None
    r = c.post("/v1/chat/completions", json={"messages": msgs}, headers={"X-Agentrft-Session": "no spaces"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id"
    assert "\n" not in r.json()["error"]["message"]


def test_a_served_session_is_recorded_once_when_it_ends() -> None:
    class ListStore:
        def __init__(self) -> None:
            self.trajs: list[Trajectory] = []

        def add_trajectory(self, traj: Trajectory) -> str:
            self.trajs.append(traj)
            return traj.id

    store = ListStore()
    sampler = FakeSampler(["hello", "bye"])
    c = TestClient(create_app(sampler, store=store, run_id="r"), raise_server_exceptions=False)
    r1 = post(c, "conv", [{"role": "user", "content": "hi"}])
    post(c, "conv", [{"role": "user", "content": "hi"}, r1, {"role": "user", "content": "again"}])
    assert store.trajs == []  # a session's requests are one episode, recorded when it ends
    end = c.post("/v1/sessions/conv/end")
    assert end.status_code == 200 and end.json()["requests"] == 2 and end.json()["segments"] == 1
    (traj,) = store.trajs
    assert traj.run_id == "r" and traj.metadata["session_id"] == "conv" and traj.num_turns == 2
    assert json.loads(traj.to_json())["tokens"]["segment"] is None
    assert c.post("/v1/sessions/conv/end").status_code == 404


def test_sessions_still_open_at_shutdown_are_recorded() -> None:
    class ListStore:
        def __init__(self) -> None:
            self.trajs: list[Trajectory] = []

        def add_trajectory(self, traj: Trajectory) -> str:
            self.trajs.append(traj)
            return traj.id

    store = ListStore()
    with TestClient(create_app(FakeSampler(["a", "b"]), store=store), raise_server_exceptions=False) as c:
        post(c, "left-open", [{"role": "user", "content": "hi"}])
        c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "no session"}]})
        assert [t.task_id.startswith("chatcmpl-") for t in store.trajs] == [True]  # outside a session: at once
    assert [t.metadata.get("session_id") for t in store.trajs] == [None, "left-open"]
