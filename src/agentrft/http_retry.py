"""One retry policy for outgoing HTTP calls (the OpenAI-compatible sampler, model and endpoint graders).

Transient failures are retried: connection errors, timeouts, a connection dropped mid-response, and
the statuses 408, 409, 429 and 5xx (the set the OpenAI client retries). The wait before retry ``n``
(0-based) is drawn uniformly from ``[0, min(max_backoff_s, backoff_s * 2**n)]`` ("full jitter": many
clients failing together do not retry in lock-step), unless the server sent ``Retry-After``
(seconds or an HTTP date), which is honoured up to ``max_retry_after_s``. Any other answer, success
or not, is returned to the caller at once: a 400 will not improve by asking again.
After ``max_retries`` retries the last failure is raised as :class:`RetriesExhausted`.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({408, 409, 429})  # and every 5xx
# Not httpx.TransportError as a whole: UnsupportedProtocol or LocalProtocolError are our own mistakes.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


class RetriesExhausted(Exception):
    """Every attempt failed transiently; the message gives the number of attempts and the last failure."""

    def __init__(self, attempts: int, last: str) -> None:
        super().__init__(f"gave up after {attempts} attempts; last error: {last}")
        self.attempts = attempts
        self.last = last


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry (all times in seconds)."""

    max_retries: int = 2  # retries after the first attempt
    backoff_s: float = 0.5  # the first wait's upper bound; doubles with each retry
    max_backoff_s: float = 20.0
    max_retry_after_s: float = 60.0  # a longer Retry-After is cut to this: a worker must not stall for an hour

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0 or self.max_retry_after_s < 0:
            raise ValueError(f"RetryPolicy needs non-negative retries and waits, got {self}")

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        return rng.uniform(0.0, min(self.max_backoff_s, self.backoff_s * 2**retry))


def is_transient_status(status: int) -> bool:
    return status in RETRY_STATUSES or status >= 500


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds to wait: a number of seconds, or an HTTP date; None when absent or unreadable."""
    if value is None or not value.strip():
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": RFC 9110 dates are GMT anyway
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


async def send_with_retries(
    send: Callable[[], Awaitable[httpx.Response]],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> httpx.Response:
    """Call ``send`` until it gives a non-transient response, and return that response (whatever its status).

    Raises :class:`RetriesExhausted` when every attempt failed transiently; other exceptions from
    ``send`` (non-transient ``httpx.HTTPError`` included) propagate at once. ``sleep`` and ``rng``
    are there for tests.
    """
    rng = rng or random.Random()
    last = ""
    for retry in range(policy.max_retries + 1):
        retry_after: float | None = None
        try:
            response = await send()
        except TRANSIENT_ERRORS as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if not is_transient_status(response.status_code):
                return response
            last = f"HTTP {response.status_code}: {response.text[:300]}"
            retry_after = parse_retry_after(response.headers.get("retry-after"))
        if retry < policy.max_retries:
            await sleep(policy.delay(retry, retry_after, rng))
    raise RetriesExhausted(policy.max_retries + 1, last)
