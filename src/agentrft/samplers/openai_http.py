"""`ChatSampler` over any OpenAI-compatible Chat Completions endpoint.

Transient failures (HTTP 408/409/429 and 5xx, timeouts, dropped connections)
are retried by the shared `agentrft.http_retry` (exponential backoff with full
jitter, honouring `Retry-After`); other 4xx answers fail at once with the
server's message. A semaphore bounds the requests in flight.

Token ids: a plain OpenAI endpoint returns none, so the result is marked
`extra["eval_only"] = True` and its trajectory cannot be trained on. With
`token_ids=True` the sampler asks a vLLM server for them (`logprobs`,
`return_tokens_as_token_ids`, `return_token_ids`) and fills `prompt_ids`,
`token_ids` and `logprobs` from whatever of those the server sends back.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from agentrft.http_retry import RetriesExhausted, RetryPolicy, send_with_retries
from agentrft.samplers.base import ChatResult, FinishReason, SamplingParams


class SamplerHTTPError(RuntimeError):
    """The endpoint refused the request or kept failing; the message names the URL and the cause."""


class OpenAIChatSampler:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 20.0,
        token_ids: bool = False,
        extra_body: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        policy_version: int = 0,
    ) -> None:
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError("max_concurrency >= 1, max_retries >= 0 and timeout_s > 0 are required")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.policy = f"openai:{model}"
        self.policy_version = policy_version
        self.api_key = api_key
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s)
        self.token_ids = token_ids
        self.extra_body = dict(extra_body or {})
        self._transport = transport
        # The client and semaphore belong to one event loop; rebuilt if another one calls.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None

    def _body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: SamplingParams
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if tools:
            body["tools"] = tools
        if params.stop:
            body["stop"] = params.stop
        if params.seed is not None:
            body["seed"] = params.seed
        if params.top_k is not None:
            body["top_k"] = params.top_k  # not OpenAI's; vLLM and most open servers accept it
        if self.token_ids:
            body.update(logprobs=True, top_logprobs=0, return_tokens_as_token_ids=True, return_token_ids=True)
        body.update(self.extra_body)
        return body

    def _ensure_client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._sem is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=headers, transport=self._transport)
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._client, self._sem

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: SamplingParams
    ) -> ChatResult:
        client, sem = self._ensure_client()
        body = self._body(messages, tools, params)
        t0 = time.perf_counter()
        async with sem:
            data = await self._post_with_retries(client, body)
        result = parse_chat_response(data, self.url)
        result.latency_s = time.perf_counter() - t0
        return result

    async def _post_with_retries(self, client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = await send_with_retries(lambda: client.post(self.url, json=body), self.retry)
        except RetriesExhausted as err:
            raise SamplerHTTPError(f"POST {self.url} {err}") from None
        except httpx.HTTPError as exc:  # not transient (e.g. an unsupported URL scheme): retrying cannot help
            raise SamplerHTTPError(f"POST {self.url} failed: {type(exc).__name__}: {exc}") from None
        if resp.status_code >= 300:
            raise SamplerHTTPError(f"POST {self.url} failed with HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            data = resp.json()
        except ValueError:
            raise SamplerHTTPError(f"POST {self.url}: response is not JSON: {resp.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise SamplerHTTPError(f"POST {self.url}: expected a JSON object, got {type(data).__name__}")
        return data

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _finish(choice: dict[str, Any]) -> FinishReason:
    reason = choice.get("finish_reason")
    if reason == "length":
        return "length"
    if reason == "stop" and isinstance(choice.get("stop_reason"), str):
        return "stop_string"  # vLLM names the matched stop string in `stop_reason`
    return "stop"  # "stop", "tool_calls", "function_call", "content_filter": the turn ended


def parse_chat_response(data: dict[str, Any], where: str = "response") -> ChatResult:
    """A `ChatResult` from a Chat Completions JSON object (first choice)."""
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise SamplerHTTPError(f"{where}: no choices in response: {str(data)[:200]}")
    choice = choices[0]
    raw = choice.get("message") or {}
    message: dict[str, Any] = {"role": "assistant", "content": raw.get("content")}
    if raw.get("tool_calls"):
        message["tool_calls"] = raw["tool_calls"]
    extra: dict[str, Any] = {}
    for key in ("reasoning_content", "reasoning"):
        if raw.get(key):
            extra["reasoning"] = raw[key]
    usage = data.get("usage") or {}
    token_ids, logprobs = _tokens(choice)
    prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    if token_ids is None:
        extra["eval_only"] = True
    return ChatResult(
        message=message,
        finish_reason=_finish(choice),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_ids=list(prompt_ids) if prompt_ids else None,
        token_ids=token_ids,
        logprobs=logprobs,
        extra=extra,
    )


def _tokens(choice: dict[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """Sampled ids and log-probs from vLLM's `token_ids` and/or `logprobs.content` ("token_id:N")."""
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(c["logprob"]) for c in content] if content else None
    ids = choice.get("token_ids")
    if ids is None and content:
        try:
            ids = [int(str(c["token"]).removeprefix("token_id:")) for c in content]
        except ValueError:  # plain token strings: the server ignored return_tokens_as_token_ids
            ids = None
    if ids is not None and logprobs is not None and len(ids) != len(logprobs):
        logprobs = None  # a mismatch would misalign training; keep the ids only
    return (list(map(int, ids)) if ids is not None else None), logprobs
