"""The shared HTTP retry helper against httpx.MockTransport (no network, no real waiting)."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import random

import httpx
import pytest

from agentrft.http_retry import RetriesExhausted, RetryPolicy, is_transient_status, parse_retry_after, send_with_retries

URL = "http://fake/v1/chat/completions"
Answer = httpx.Response | Exception


class Script:
    """Serves scripted answers in order (the last one repeats) and counts the requests."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def run(script: Script, policy: RetryPolicy, seed: int = 0) -> tuple[httpx.Response, list[float]]:
    """The final response and the waits the helper asked for (recorded, not slept)."""
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.MockTransport(script)) as client:
            return await send_with_retries(
                lambda: client.post(URL, json={"x": 1}), policy, sleep=record, rng=random.Random(seed)
            )

    return asyncio.run(go()), waits


def failure(kind: type[httpx.TransportError]) -> Exception:
    return kind("boom", request=httpx.Request("POST", URL))


def test_transient_failures_are_retried_with_full_jitter_backoff() -> None:
    script = Script(
        httpx.Response(503, text="busy"),
        httpx.Response(429),
        failure(httpx.ConnectError),
        failure(httpx.ReadTimeout),
        failure(httpx.RemoteProtocolError),
        httpx.Response(408),
        httpx.Response(200, json={"ok": True}),
    )
    policy = RetryPolicy(max_retries=6, backoff_s=0.5, max_backoff_s=4.0)
    response, waits = run(script, policy, seed=7)
    assert response.status_code == 200 and response.json() == {"ok": True} and script.requests == 7
    rng = random.Random(7)
    caps = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]  # doubles from backoff_s, then capped at max_backoff_s
    assert waits == [rng.uniform(0.0, cap) for cap in caps]
    assert all(0.0 <= w <= cap for w, cap in zip(waits, caps, strict=True))


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422, 200, 201, 302])
def test_other_answers_come_back_at_once(status: int) -> None:
    script = Script(httpx.Response(status, text="no"), httpx.Response(200))
    response, waits = run(script, RetryPolicy(max_retries=3))
    assert response.status_code == status and script.requests == 1 and waits == []


def test_retry_after_seconds_and_date_are_honoured_up_to_the_cap() -> None:
    in_30s = email.utils.format_datetime(
        datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30), usegmt=True
    )
    script = Script(
        httpx.Response(429, headers={"Retry-After": "3"}),
        httpx.Response(503, headers={"Retry-After": in_30s}),
        httpx.Response(503, headers={"Retry-After": "7200"}),
        httpx.Response(503, headers={"Retry-After": "soon"}),
        httpx.Response(200),
    )
    response, waits = run(script, RetryPolicy(max_retries=4, backoff_s=0.5, max_retry_after_s=60.0))
    assert response.status_code == 200
    assert waits[0] == 3.0
    assert 28.0 < waits[1] <= 30.0
    assert waits[2] == 60.0  # an hour-long Retry-After is cut to max_retry_after_s
    assert 0.0 <= waits[3] <= 4.0  # unreadable: the ordinary backoff (0.5 * 2**3)


def test_gives_up_after_max_retries_naming_the_last_failure() -> None:
    script = Script(failure(httpx.ConnectError), httpx.Response(503, text="down for maintenance"))
    with pytest.raises(RetriesExhausted, match="gave up after 3 attempts; last error: HTTP 503: down for maint") as e:
        run(script, RetryPolicy(max_retries=2))
    assert e.value.attempts == 3 and script.requests == 3
    script = Script(failure(httpx.ReadTimeout))
    with pytest.raises(RetriesExhausted, match="gave up after 1 attempts; last error: ReadTimeout: boom"):
        run(script, RetryPolicy(max_retries=0))
    assert script.requests == 1


def test_non_transient_transport_errors_propagate_at_once() -> None:
    script = Script(failure(httpx.UnsupportedProtocol), httpx.Response(200))
    with pytest.raises(httpx.UnsupportedProtocol):
        run(script, RetryPolicy(max_retries=3))
    assert script.requests == 1


def test_real_sleep_by_default() -> None:
    async def go() -> httpx.Response:
        transport = httpx.MockTransport(Script(httpx.Response(502), httpx.Response(200)))
        async with httpx.AsyncClient(transport=transport) as client:
            return await send_with_retries(lambda: client.get(URL), RetryPolicy(max_retries=1, backoff_s=0.001))

    assert asyncio.run(go()).status_code == 200


def test_parse_retry_after() -> None:
    assert parse_retry_after(None) is None and parse_retry_after(" ") is None
    assert parse_retry_after("2.5") == 2.5 and parse_retry_after("-4") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412500.0) == 0.0  # in the past
    assert parse_retry_after("tomorrow") is None


def test_transient_statuses() -> None:
    assert [s for s in (200, 400, 404, 408, 409, 429, 500, 502, 503, 599) if is_transient_status(s)] == [
        408,
        409,
        429,
        500,
        502,
        503,
        599,
    ]


def test_policy_rejects_negative_values() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError, match="non-negative"):
        RetryPolicy(backoff_s=-0.1)
