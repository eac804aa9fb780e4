"""Lockstep scheduling: a rollout whose every sample is a function of its seed, not of timing.

A batching sampler decodes whatever requests have arrived together, and on a busy machine (or just another
run) they arrive in another order and in other batches. Both change what is sampled: the per-prompt seed
counter (`samplers.seeding`) hands seeds out in arrival order, and a row's logits differ in their last bits
with the batch it was computed in, which is enough to flip a sampled token now and then and send the episode
elsewhere. So the same `--seed` gave other trajectories on a loaded machine.

Lockstep takes timing out of both. The runner's episodes are numbered (task, then sample order); at most
`max_live` play at once, admitted strictly in that order, the next one at the very moment another ends. A
sample request is held until every live episode has either asked for its next sample or ended; then the
wave goes to the sampler at once, in episode order (`HFSampler.sample_together` admits it as one batch).
Which requests form a wave, their order and their seeds are then fixed by the seed and the episodes' own
tokens; the wave's replies can come back in any order without changing anything. What it costs: an
episode's next turn waits for the slowest reply of its wave (measured in `benchmarks/lockstep.py`).

Outside its reach: episodes played by an agent program over `serve` (their requests come over HTTP, timed by
that program), the async pipeline's overlapping groups, and environments whose tools answer by the clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from agentrft.samplers.base import SampleRequest, SampleResult, TokenSampler


class Lockstep:
    """Admits episodes ``0..n-1`` in order, ``max_live`` at a time, and sends their samples in waves."""

    def __init__(self, sampler: TokenSampler, n: int, max_live: int) -> None:
        if max_live < 1:
            raise ValueError(f"max_live must be at least 1, got {max_live}")
        self.sampler = sampler
        self._next = 0  # the next episode to admit
        self._n = n
        self._live: set[int] = set()
        self._admitted: dict[int, asyncio.Event] = {i: asyncio.Event() for i in range(n)}
        self._held: dict[int, tuple[SampleRequest, asyncio.Future[SampleResult]]] = {}
        self._relays: set[asyncio.Task[None]] = set()
        for _ in range(min(max_live, n)):
            self._admit_next()

    def _admit_next(self) -> None:
        if self._next < self._n:
            self._live.add(self._next)
            self._admitted.pop(self._next).set()
            self._next += 1

    async def enter(self, index: int) -> None:
        """Wait until episode ``index`` may play."""
        event = self._admitted.get(index)
        if event is not None:
            await event.wait()

    def leave(self, index: int) -> None:
        """Episode ``index`` ended (finished, failed or cancelled): the next in order takes its place at once."""
        if index not in self._live:
            return
        self._live.discard(index)
        held = self._held.pop(index, None)
        if held is not None and not held[1].done():
            held[1].cancel()
        self._admit_next()
        self._maybe_send()

    def view(self, index: int) -> _EpisodeSampler:
        """The sampler as episode ``index`` sees it: the same sampler, its `sample` going through the waves."""
        return _EpisodeSampler(self, index)

    async def sample(self, index: int, request: SampleRequest) -> SampleResult:
        fut: asyncio.Future[SampleResult] = asyncio.get_running_loop().create_future()
        self._held[index] = (request, fut)
        self._maybe_send()
        return await fut

    def _maybe_send(self) -> None:
        if not self._held or len(self._held) < len(self._live):
            return
        wave = sorted(self._held.items())
        self._held.clear()
        try:
            calls = _send(self.sampler, [request for _, (request, _) in wave])
        except Exception as exc:  # the sampler refused the wave as a whole: every request of it hears so
            for _, (_, fut) in wave:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (_, (_, fut)), call in zip(wave, calls, strict=True):
            relay = asyncio.ensure_future(_relay(call, fut))
            self._relays.add(relay)
            relay.add_done_callback(self._relays.discard)


def _send(sampler: TokenSampler, requests: list[SampleRequest]) -> list[Awaitable[SampleResult]]:
    """The wave to the sampler as one batch where it can take one, else request by request in order (each
    sampler derives unseeded requests' seeds in the order it is called: `samplers.seeding`)."""
    together = getattr(sampler, "sample_together", None)
    if together is not None:
        return list(together(requests))
    return [sampler.sample(r) for r in requests]


async def _relay(call: Awaitable[SampleResult], fut: asyncio.Future[SampleResult]) -> None:
    """The sampler's answer to the episode that asked; an episode that gave up cancels its request."""
    inner = asyncio.ensure_future(call)
    fut.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
    try:
        result = await inner
    except asyncio.CancelledError:
        fut.cancel()
        return
    except Exception as exc:  # the episode hears of its request's failure as from the sampler itself
        if not fut.done():
            fut.set_exception(exc)
        return
    if not fut.done():
        fut.set_result(result)


class _EpisodeSampler:
    """One episode's handle on the shared sampler: everything is the sampler's, but `sample` waits for the wave."""

    def __init__(self, lockstep: Lockstep, index: int) -> None:
        self._lockstep, self._index = lockstep, index

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lockstep.sampler, name)

    async def sample(self, request: SampleRequest) -> SampleResult:
        return await self._lockstep.sample(self._index, request)
