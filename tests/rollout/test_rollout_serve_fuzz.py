"""Fuzz over `agentrft serve`'s request body: never a 5xx, always a one-line OpenAI-style error, and
the store holds exactly the completions that were answered 200, each whole.

A seeded generator (reproducible; no extra dependency) mutates valid requests: values swapped for
wrong types and huge or odd ones, keys dropped and added, deep nesting, lone surrogates, and byte
damage to the encoded body (invalid UTF-8, UTF-16, truncation, NaN, 5,000-digit numbers, oversize).
The tiny model's real tokenizer and chat template render what passes, so what reaches them is tested too.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from agentrft.rollout.serve import ServeLimits, create_app
from agentrft.samplers.policies import load_policy
from agentrft.store import Store

TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": '{"expression": "1+1"}'}}
BASES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "What is 5829 minus 5735?"}], "max_tokens": 2},
    {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Add 1 and 1."}]},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "2"},
        ],
        "tools": [TOOL],
        "tool_choice": "auto",
        "temperature": 0.7,
        "top_p": 0.9,
        "stop": ["\n\n"],
        "seed": 7,
        "max_completion_tokens": 3,
    },
]
KEYS = ["messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop"]
KEYS += ["seed", "n", "stream", "model", "role", "content", "tool_call_id", "tool_calls", "function", "name"]
KEYS += ["arguments", "parameters", "properties", "type", "text", "required", "description", "\ud800", ""]


def nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice([1, "x", None, []])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def nasty(rng: random.Random) -> Any:
    """A value of the wrong type, size or encoding."""
    return rng.choice(
        [
            lambda: None,
            lambda: rng.choice([True, False]),
            lambda: rng.choice([0, -1, 1, 2, 3, 2**31, 2**63, -(2**63) - 1, 10**30, -(10**30)]),
            lambda: rng.choice([0.5, -0.0, 1e-300, 1e308, -1e308, 2.5]),
            lambda: rng.choice(["", "x", "auto", "none", "user", "tool", "function", "calculate", "text"]),
            lambda: "y" * rng.choice([300, 5000]),
            lambda: rng.choice(["\ud800", "a\udfffb", "\udc80", "ok \U0001f600", "\x00", "\u202e\ufeff"]),
            lambda: [nasty(rng) for _ in range(rng.randint(0, 3))],
            lambda: {rng.choice(KEYS): nasty(rng) for _ in range(rng.randint(0, 3))},
            lambda: nested(rng, rng.choice([5, 31, 33, 60, 200])),
            lambda: [rng.choice(["x", 1])] * rng.choice([17, 1000]),
        ]
    )()


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*at, i))
    return out


def mutate(rng: random.Random, body: dict[str, Any]) -> None:
    """One change at a random place: replace, drop, or add."""
    if not body:
        body[rng.choice(KEYS)] = nasty(rng)
        return
    path = rng.choice(paths(body)[1:])
    parent: Any = body
    for p in path[:-1]:
        parent = parent[p]
    action = rng.random()
    if action < 0.6:
        parent[path[-1]] = nasty(rng)
    elif action < 0.8:
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    elif isinstance(parent, dict):
        parent[rng.choice(KEYS)] = nasty(rng)
    else:
        parent.append(nasty(rng))


def encode(rng: random.Random, body: dict[str, Any]) -> bytes:
    """JSON bytes of `body`, sometimes damaged. Deep values are fine: `nested` stays under Python's recursion limit."""
    ascii_only = rng.random() < 0.7
    raw = json.dumps(body, ensure_ascii=ascii_only, allow_nan=True).encode("utf-8", "surrogatepass")
    damage = rng.random()
    if damage < 0.6:
        return raw
    cut = rng.randrange(len(raw) + 1)
    return rng.choice(
        [
            lambda: raw[:cut],
            lambda: raw[:cut] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\xe2\x82"]) + raw[cut:],
            lambda: raw.replace(b"2", b"NaN", 1).replace(b"0.7", b"Infinity", 1),
            lambda: raw.replace(b": 2", b": 1" + b"0" * 5000, 1).replace(b": 7", b": -" + b"9" * 5000, 1),
            lambda: b"\xef\xbb\xbf" + raw,
            lambda: json.dumps(body).encode("utf-16"),
            lambda: raw[:cut] + b"[" * 100_000 + raw[cut:],
            lambda: b'{"messages": [{"role": "user", "content": "' + b"z" * 70_000 + b'"}]}',
            lambda: b" " * 100 + raw + b" " * 100,
            lambda: raw.replace(b"{", b"[", 1),
        ]
    )()


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    sampler = load_policy("tiny")
    yield sampler
    sampler.close()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fuzzed_bodies_are_4xx_one_line_or_served_and_recorded_whole(tiny, tmp_path, seed: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    limits = ServeLimits(max_body_bytes=64 * 1024, max_tokens_limit=4, default_max_tokens=2, context_tokens=8192)
    with Store(tmp_path / "fuzz.db") as store:
        app = create_app(tiny, store=store, limits=limits, run_id="fuzz")
        client = TestClient(app, raise_server_exceptions=False)
        served: list[str] = []
        statuses: dict[int, int] = {}
        for case in range(150):
            body = json.loads(json.dumps(rng.choice(BASES)))
            for _ in range(rng.choice([0, 1, 1, 2, 3])):
                mutate(rng, body)
            raw = encode(rng, body)
            r = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            where = f"seed {seed} case {case}: {raw[:300]!r}"
            assert r.status_code in (200, 400, 413), f"{r.status_code} {r.text[:500]} <- {where}"
            if r.status_code == 200:
                served.append(r.json()["id"])
                continue
            err = r.json()["error"]
            assert err["type"] == "invalid_request_error" and isinstance(err["message"], str), where
            assert "\n" not in err["message"] and 0 < len(err["message"]) <= 400, f"{err} <- {where}"
            assert err["param"] is None or isinstance(err["param"], str), where
        assert app.state.store_errors == []
        trajs = store.query_trajectories(run_id="fuzz")
        assert sorted(t.task_id for t in trajs) == sorted(served)
        for t in trajs:
            assert t.tokens is not None
            n = len(t.tokens.ids)
            assert n == len(t.tokens.loss_mask) == len(t.tokens.logprobs) == len(t.tokens.turn)
            assert 1 <= sum(t.tokens.loss_mask) <= 4 and t.tokens.loss_mask == sorted(t.tokens.loss_mask)
            assert t.messages[-1].role == "assistant"
        assert store.integrity_check() == "ok"
    # the generator reaches every outcome, not only one kind of refusal
    assert statuses.get(200, 0) >= 5 and statuses.get(400, 0) >= 50, statuses
    print(f"\n[fuzz] seed {seed}: statuses {dict(sorted(statuses.items()))}")
