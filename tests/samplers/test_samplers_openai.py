"""OpenAIChatSampler against an in-process fake endpoint (httpx.MockTransport)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from agentrft.samplers.base import ChatSampler, SamplingParams
from agentrft.samplers.openai_http import OpenAIChatSampler, SamplerHTTPError
from agentrft.samplers.policies import PolicyError, load_policy

MSGS = [{"role": "user", "content": "What is 2+2?"}]
PARAMS = SamplingParams(temperature=0.0, max_tokens=5, stop=["\n"], seed=3)


def reply(**choice_extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}}
    choice.update(choice_extra)
    return {"id": "x", "choices": [choice], "usage": {"prompt_tokens": 11, "completion_tokens": 2}}


class Fake:
    """Serves a scripted list of (status, json) answers and records the requests it saw."""

    def __init__(self, answers: list[tuple[int, Any]]) -> None:
        self.answers = answers
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        status, body = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(body, Exception):
            raise body
        return httpx.Response(status, json=body)


def make(fake: Fake, **kw: Any) -> OpenAIChatSampler:
    kw.setdefault("backoff_s", 0.001)
    return OpenAIChatSampler("http://fake/v1/", "m", api_key="k", transport=httpx.MockTransport(fake), **kw)


def test_plain_reply_is_eval_only() -> None:
    fake = Fake([(200, reply())])
    s = make(fake)
    assert isinstance(s, ChatSampler) and s.policy == "openai:m"
    res = asyncio.run(s.chat(MSGS, None, PARAMS))
    assert res.message == {"role": "assistant", "content": "4"}
    assert res.finish_reason == "stop" and res.prompt_tokens == 11 and res.completion_tokens == 2
    assert res.token_ids is None and res.extra["eval_only"] is True
    body = fake.requests[0]
    assert body == {
        "model": "m",
        "messages": MSGS,
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 5,
        "stop": ["\n"],
        "seed": 3,
    }


def test_tool_calls_and_vllm_token_ids() -> None:
    calls = [{"id": "c", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}]
    lp = {"content": [{"token": "token_id:17", "logprob": -0.5}, {"token": "token_id:2", "logprob": -0.25}]}
    fake = Fake(
        [
            (
                200,
                reply(
                    message={"role": "assistant", "content": None, "tool_calls": calls},
                    finish_reason="tool_calls",
                    logprobs=lp,
                ),
            )
        ]
    )
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    res = asyncio.run(make(fake, token_ids=True).chat(MSGS, tools, PARAMS))
    assert res.message["tool_calls"] == calls and res.finish_reason == "stop"
    assert res.token_ids == [17, 2] and res.logprobs == [-0.5, -0.25]
    assert "eval_only" not in res.extra
    assert fake.requests[0]["tools"] == tools and fake.requests[0]["return_tokens_as_token_ids"] is True


def test_stop_reason_and_length() -> None:
    res = asyncio.run(make(Fake([(200, reply(stop_reason="\n"))])).chat(MSGS, None, PARAMS))
    assert res.finish_reason == "stop_string"
    res = asyncio.run(make(Fake([(200, reply(finish_reason="length"))])).chat(MSGS, None, PARAMS))
    assert res.finish_reason == "length"


def test_retries_503_and_429_then_succeeds() -> None:
    fake = Fake([(503, {"error": "busy"}), (429, {"error": "slow down"}), (200, reply())])
    res = asyncio.run(make(fake, max_retries=2).chat(MSGS, None, PARAMS))
    assert res.message["content"] == "4" and len(fake.requests) == 3


def test_retries_timeout_then_succeeds() -> None:
    fake = Fake([(0, httpx.ReadTimeout("slow")), (200, reply())])
    res = asyncio.run(make(fake, max_retries=1).chat(MSGS, None, PARAMS))
    assert res.message["content"] == "4" and len(fake.requests) == 2


def test_gives_up_with_clear_error() -> None:
    fake = Fake([(503, {"error": "down for maintenance"})])
    with pytest.raises(SamplerHTTPError, match=r"gave up after 3 attempts; last error: HTTP 503.*maintenance"):
        asyncio.run(make(fake, max_retries=2).chat(MSGS, None, PARAMS))
    assert len(fake.requests) == 3


def test_client_error_is_not_retried() -> None:
    fake = Fake([(400, {"error": "bad model"})])
    with pytest.raises(SamplerHTTPError, match="HTTP 400.*bad model"):
        asyncio.run(make(fake).chat(MSGS, None, PARAMS))
    assert len(fake.requests) == 1


def test_concurrency_limit() -> None:
    fake = Fake([(200, reply())])
    s = make(fake, max_concurrency=3)

    async def many() -> None:
        await asyncio.gather(*(s.chat(MSGS, None, PARAMS) for _ in range(10)))

    asyncio.run(many())
    assert len(fake.requests) == 10 and fake.max_in_flight == 3


def test_policy_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(PolicyError, match="OPENAI_BASE_URL"):
        load_policy("openai:gpt-x")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://host:8000/v1")
    s = load_policy("openai:gpt-x", max_concurrency=2)
    assert isinstance(s, OpenAIChatSampler) and s.url == "http://host:8000/v1/chat/completions"
    assert load_policy("openai:gpt-x", base_url="http://b/v1").url == "http://b/v1/chat/completions"
