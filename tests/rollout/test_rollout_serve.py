"""`agentrft serve` app: OpenAI-shaped responses, tool calls, recording, and 4xx on malformed requests.

Abuse over real HTTP with the tiny model (limits, disconnects, shutdown) is in
test_rollout_serve_limits.py; the request-body fuzz in test_rollout_serve_fuzz.py."""

from __future__ import annotations

import json

import pytest
from rollout_fakes import TOOLS, FakeSampler, decode

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from agentrft.rollout.serve import ServeLimits, create_app
from agentrft.types import Trajectory


class ListStore:
    def __init__(self) -> None:
        self.trajs: list[Trajectory] = []

    def add_trajectory(self, traj: Trajectory) -> str:
        self.trajs.append(traj)
        return traj.id


class CountingSampler(FakeSampler):
    """Counts renders too: a refused request must not reach the tokenizer either."""

    renders = 0

    def render(self, messages, tools=None, add_generation_prompt=True):  # type: ignore[no-untyped-def]
        self.renders += 1
        return super().render(messages, tools, add_generation_prompt)


def client(outputs: list[str], api_key: str | None = None, **kw) -> tuple[TestClient, CountingSampler, ListStore]:
    sampler, store = CountingSampler(outputs), ListStore()
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
        ({"messages": USER, "n": 0}, "n"),
        ({"messages": USER, "n": 9}, "n"),
        ({"messages": USER, "stream": [True]}, "stream"),
        ({"messages": USER, "tools": "calculate"}, "tools"),
    ],
)
def test_malformed_requests_are_400(payload: dict, param: str) -> None:
    assert_refused(json.dumps(payload).encode(), param)


def assert_refused(raw: bytes, param: str | None, status: int = 400, **kw) -> dict:
    """A one-line OpenAI-style 4xx naming `param`, and no tokenizer, model or store work."""
    c, sampler, store = client(["never"], **kw)
    r = c.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert "\n" not in err["message"] and (param is None or err["message"].startswith(param)), err
    assert sampler.renders == 0 and sampler.prompts == [] and store.trajs == []
    return err


def _tool(function: object) -> dict:
    return {"messages": USER, "tools": [{"type": "function", "function": function}]}


CALL = {"id": "call_1", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}


@pytest.mark.parametrize(
    "payload,param",
    [
        # tool schemas the formats would crash on (TypeError / AttributeError → 500 before)
        (_tool({"name": 5}), "tools.0.function.name"),
        (_tool({"name": "a b"}), "tools.0.function.name"),
        (_tool({"name": "f", "parameters": "x"}), "tools.0.function.parameters"),
        (_tool({"name": "f", "parameters": {"type": "object", "properties": ["x"]}}), "tools.0.function.parameters"),
        (_tool({"name": "f", "parameters": {"type": "string"}}), "tools.0.function.parameters"),
        (_tool({"name": "f", "description": 7}), "tools.0.function.description"),
        ({"messages": USER, "tools": [{"type": "function"}]}, "tools.0.function"),
        ({"messages": USER, "tools": [{"function": {"name": "f"}}]}, "tools.0.type"),
        ({"messages": USER, "tool_choice": "sometimes"}, "tool_choice"),
        (  # parsed by the formats when rendered: RecursionError before
            {
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[" * 50_000}}],
                    },
                ]
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
        # messages that make no sense
        ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
        ({"messages": [{"role": "system", "content": None}, *USER]}, "messages.0.content"),
        ({"messages": [*USER, {"role": "assistant"}]}, "messages.1.content"),
        (
            {"messages": [*USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "94"}]},
            "messages.2.tool_call_id",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content.0",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages.0.content.0"),
        # huge values
        ({"messages": USER, "seed": 10**30}, "seed"),
        ({"messages": USER, "seed": -(2**64)}, "seed"),
        ({"messages": USER, "max_tokens": 10**12}, "max_tokens"),
        ({"messages": USER, "max_completion_tokens": 4097}, "max_completion_tokens"),
        ({"messages": USER, "stop": ["x"] * 17}, "stop"),
        ({"messages": USER, "stop": "x" * 257}, "stop"),
        ({"messages": USER, "temperature": 1e308}, "temperature"),
    ],
)
def test_bad_requests_are_refused_before_model_work(payload: dict, param: str) -> None:
    assert_refused(json.dumps(payload).encode(), param)


def test_max_tokens_over_the_server_limit_names_the_limit() -> None:
    err = assert_refused(
        json.dumps({"messages": USER, "max_tokens": 65}).encode(),
        "max_tokens",
        limits=ServeLimits(max_tokens_limit=64, default_max_tokens=8),
    )
    assert err["code"] == "max_tokens_too_large" and "64" in err["message"]


@pytest.mark.parametrize(
    "raw,param",
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b"\xff\xfe", None),
        (b"", None),
        ('{"messages": []}'.encode("utf-16"), None),  # not UTF-8
        (b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', None),  # invalid UTF-8 sequence
        (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages.0.content"),  # lone surrogate
        (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages.0.content"),
        (b'{"messages": [{"role": "user", "content": "hi", "\\ud800": 1}]}', "messages.0.\\ud800"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', None),
        (b'{"messages": [{"role": "user", "content": "hi"}], "top_p": -Infinity}', None),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 5000 + b"}", None),
        (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),  # RecursionError → 500 before
        (b'{"messages": [{"role": "user", "content": "hi", "x": ' + b"[" * 40 + b"]" * 40 + b"}]}", None),
        (b'{"messages": [{"role": "user", "content": "hi", "x": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b"}]}", None),
    ],
)
def test_bad_bodies_are_400(raw: bytes, param: str | None) -> None:
    assert_refused(raw, param)


def test_paired_surrogates_and_brackets_in_strings_are_fine() -> None:
    c, _, store = client(["ok"])
    content = "\U0001f600 " + "[" * 100 + "{" * 100
    raw = json.dumps({"messages": [{"role": "user", "content": content}]}).encode()  # \ud83d\ude00 escapes
    assert b"\\ud83d\\ude00" in raw
    r = c.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert store.trajs[0].messages[0].content == content


def test_null_tool_fields_are_left_out() -> None:
    c, sampler, _ = client(["ok"])
    tool = {"type": "function", "function": {"name": "f", "description": None, "parameters": None, "strict": None}}
    r = c.post("/v1/chat/completions", json={"messages": USER, "tools": [tool]})  # AttributeError (500) before
    assert r.status_code == 200, r.text
    assert "- f(): " in decode(sampler.prompts[0])


def test_nulls_mean_defaults() -> None:
    c, sampler, _ = client(["ok"])
    nulls = dict.fromkeys(["temperature", "top_p", "max_tokens", "stop", "seed", "n", "stream", "tools", "tool_choice"])
    r = c.post("/v1/chat/completions", json={"messages": USER, **nulls})
    assert r.status_code == 200, r.text
    params = sampler.requests[0].params
    assert (params.temperature, params.top_p, params.max_tokens, params.stop) == (1.0, 1.0, 512, [])


def test_template_refusal_is_400() -> None:
    def strict(messages, tools, add_generation_prompt):  # type: ignore[no-untyped-def]
        raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")

    c = TestClient(create_app(FakeSampler([], template=strict)), raise_server_exceptions=False)
    r = c.post("/v1/chat/completions", json={"messages": USER})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages" and "roles must alternate" in err["message"]


def test_limits_are_consistent() -> None:
    with pytest.raises(ValueError, match="default_max_tokens"):
        ServeLimits(default_max_tokens=5000, max_tokens_limit=4096)


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
    r = CliRunner().invoke(app, ["serve", "--max-tokens", "5000"])
    assert r.exit_code == 2 and "exceeds --max-tokens-limit 4096" in r.output


def test_max_tokens_must_fit_the_context_with_the_prompt() -> None:
    limits = ServeLimits(context_tokens=100, default_max_tokens=512, max_tokens_limit=4096)
    c, sampler, store = client(["ok", "ok"], limits=limits)
    n_prompt = len(sampler.render(USER))
    room = 100 - n_prompt
    r = c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": room + 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens" and err["code"] == "context_length_exceeded"
    assert f"at most {room}" in err["message"] and sampler.prompts == [] and store.trajs == []
    r = c.post("/v1/chat/completions", json={"messages": USER, "max_completion_tokens": room + 1})
    assert r.json()["error"]["param"] == "max_completion_tokens"
    # exactly full is fine; without max_tokens the server default is cut to the room left
    assert c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": room}).status_code == 200
    assert c.post("/v1/chat/completions", json={"messages": USER}).status_code == 200
    assert [rq.params.max_tokens for rq in sampler.requests] == [room, room]
    long = [{"role": "user", "content": "x" * 100}]
    r = c.post("/v1/chat/completions", json={"messages": long, "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages" and err["code"] == "context_length_exceeded"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.7", "example.com"])
def test_cli_refuses_a_public_host_without_api_key(host: str) -> None:
    from typer.testing import CliRunner

    from agentrft.cli.main import app

    r = CliRunner().invoke(app, ["serve", "--host", host])
    assert r.exit_code == 2, r.output
    assert (
        r.output.strip()
        == f"error: --host {host} is reachable from other machines; set --api-key KEY (or bind 127.0.0.1)"
    )
    r = CliRunner().invoke(app, ["serve", "--host", "127.0.0.1", "--api-key", " "])
    assert r.exit_code == 2 and r.output.strip() == "error: --api-key is empty"


def test_cli_warns_on_a_public_host_with_api_key_and_loopback_is_quiet() -> None:
    from typer.testing import CliRunner

    from agentrft.cli.main import app
    from agentrft.cli.serve import is_loopback

    # --tool-format yaml stops the command right after the host check, before a model is loaded
    r = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--api-key", "k", "--tool-format", "yaml"])
    assert r.exit_code == 2 and r.output.startswith("warning: serving on 0.0.0.0, reachable from other machines")
    assert all(is_loopback(h) for h in ["127.0.0.1", "127.3.2.1", "::1", "localhost"])


def test_empty_api_key_is_refused() -> None:
    with pytest.raises(ValueError, match="every client"):
        create_app(FakeSampler([]), api_key="")


def test_a_client_seed_is_ignored_and_counted_under_the_runs_sampling() -> None:
    # an agent program that always sends seed=7 would give every episode of a group the same tokens
    from agentrft.samplers.base import SamplingParams

    body = {"messages": USER, "seed": 7, "n": 2}
    c, sampler, _ = client(["1", "2", "3", "4"], sampling=SamplingParams(temperature=1.0, max_tokens=16))
    assert c.post("/v1/chat/completions", json=body).status_code == 200
    assert c.post("/v1/chat/completions", json={**body, "n": 1}).status_code == 200
    assert [r.params.seed for r in sampler.requests] == [None, None, None]
    assert c.app.state.ignored_seeds == 2
    served, plain, _ = client(["1", "2"])  # outside training the client's seed is honoured (choice i: seed + i)
    assert served.post("/v1/chat/completions", json=body).status_code == 200
    assert [r.params.seed for r in plain.requests] == [7, 8] and served.app.state.ignored_seeds == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", "max_sessions"], "error: --limit 'max_sessions': expected KEY=VALUE, e.g. max_sessions=100"),
        (["--limit", "sessions=5"], "error: --limit 'sessions=5': unknown key 'sessions'; valid: max_json_depth,"),
        (["--limit", "context_tokens=99"], "error: --limit 'context_tokens=99': unknown key 'context_tokens'"),
        (["--limit", "max_sessions=0"], "error: --limit max_sessions=0: Input should be greater than or equal to 1"),
        (["--limit", "session_idle_s=soon"], "error: --limit session_idle_s=soon: Input should be a valid number"),
    ],
)
def test_cli_limit_errors_name_the_pair_before_a_store_or_model(tmp_path, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from agentrft.cli.main import app

    db = tmp_path / "serve.db"
    r = CliRunner().invoke(app, ["serve", "--db", str(db), "--policy", "no-such-policy", *args])
    assert r.exit_code == 2 and r.output.startswith(message), r.output
    assert not db.exists()
