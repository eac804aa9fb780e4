"""`agentrft serve` app: OpenAI-shaped responses, tool calls, recording, and 4xx on malformed requests."""

from __future__ import annotations

import json

import pytest
from rollout_fakes import TOOLS, FakeSampler, decode

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from agentrft.rollout.serve import create_app
from agentrft.types import Trajectory


class ListStore:
    def __init__(self) -> None:
        self.trajs: list[Trajectory] = []

    def add_trajectory(self, traj: Trajectory) -> str:
        self.trajs.append(traj)
        return traj.id


def client(outputs: list[str], api_key: str | None = None, **kw) -> tuple[TestClient, FakeSampler, ListStore]:
    sampler, store = FakeSampler(outputs), ListStore()
    app = create_app(sampler, store=store, api_key=api_key, run_id="serve-run", **kw)
    return TestClient(app, raise_server_exceptions=False), sampler, store


USER = [{"role": "user", "content": "What is 5829 minus 5735?"}]


def test_plain_completion_and_record() -> None:
    c, sampler, store = client(["94"])
    r = c.post("/v1/chat/completions", json={"model": "x", "messages": USER, "temperature": 0, "max_tokens": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "fake-policy"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "94"}
    assert body["choices"][0]["finish_reason"] == "stop"
    prompt = sampler.prompts[0]
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 3, "total_tokens": len(prompt) + 3}
    assert sampler.requests[0].params.max_tokens == 7 and sampler.requests[0].params.temperature == 0
    (traj,) = store.trajs
    assert traj.tokens.ids == prompt + sampler.results[0].token_ids
    assert traj.tokens.loss_mask == [0] * len(prompt) + [1] * 3
    assert traj.run_id == "serve-run" and traj.messages[-1].content == "94" and traj.env.name == "serve"


def test_tool_call_round_trip_and_continuation() -> None:
    c, sampler, store = client(["Let me see <calculate>5829 - 5735</calculate>", "94"])
    r = c.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"] == {"name": "calculate", "arguments": json.dumps({"expression": "5829 - 5735"})}
    assert choice["message"]["content"] == "Let me see"
    assert "You can use these tools:" in decode(sampler.prompts[0])
    assert "</calculate>" in sampler.requests[0].params.stop
    follow = [*USER, choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "94"}]
    r2 = c.post("/v1/chat/completions", json={"messages": follow, "tools": TOOLS})
    assert r2.json()["choices"][0]["message"]["content"] == "94"
    # the client's assistant tool call is rendered back in the xml format
    assert "<|im_start|>assistant\nLet me see\n<calculate>5829 - 5735</calculate><|im_end|>" in decode(
        sampler.prompts[1]
    )
    assert len(store.trajs) == 2 and store.trajs[0].group_id == store.trajs[1].group_id
    assert store.trajs[1].tokens.turn == [1] * len(store.trajs[1].tokens.ids)


def test_models_endpoint() -> None:
    c, _, _ = client([])
    assert c.get("/v1/models").json()["data"][0]["id"] == "fake-policy"


def test_api_key() -> None:
    c, sampler, _ = client(["ok"], api_key="sekrit")
    r = c.post("/v1/chat/completions", json={"messages": USER})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert c.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
    r = c.post("/v1/chat/completions", json={"messages": USER}, headers={"Authorization": "Bearer sekrit"})
    assert r.status_code == 200 and sampler.prompts


@pytest.mark.parametrize(
    "payload,param",
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"messages": USER, "temperature": "hot"}, "temperature"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "n": 2}, "n"),
        ({"messages": USER, "stream": True}, "stream"),
        ({"messages": USER, "tools": "calculate"}, "tools"),
    ],
)
def test_malformed_requests_are_400(payload: dict, param: str) -> None:
    c, sampler, store = client(["never"])
    r = c.post("/v1/chat/completions", json=payload)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"].startswith(param)
    assert sampler.prompts == [] and store.trajs == []


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
def test_bad_json_body_is_400(raw: bytes) -> None:
    c, _, _ = client(["never"])
    r = c.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_sampler_failure_is_server_error_json() -> None:
    sampler, store = FakeSampler(["x"], fail_on=0), ListStore()
    c = TestClient(create_app(sampler, store=store), raise_server_exceptions=False)
    r = c.post("/v1/chat/completions", json={"messages": USER})
    assert r.status_code == 500 and "device lost" in r.json()["error"]["message"] and store.trajs == []


def test_sampler_value_error_is_400() -> None:
    class TooLong(FakeSampler):
        async def sample(self, request):
            raise ValueError("prompt of 9000 tokens exceeds the context of 8192")

    c = TestClient(create_app(TooLong([])), raise_server_exceptions=False)
    r = c.post("/v1/chat/completions", json={"messages": USER})
    assert r.status_code == 400 and "exceeds the context" in r.json()["error"]["message"]


def test_unknown_format_fails_at_startup() -> None:
    with pytest.raises(ValueError, match="unknown tool format"):
        create_app(FakeSampler([]), tool_format="yaml")


def test_cli_registers_serve() -> None:
    from typer.testing import CliRunner

    from agentrft.cli.main import app

    r = CliRunner().invoke(app, ["serve", "--help"])
    assert r.exit_code == 0 and "--api-key" in r.output
    r = CliRunner().invoke(app, ["serve", "--tool-format", "yaml"])
    assert r.exit_code == 2 and "unknown --tool-format" in r.output
