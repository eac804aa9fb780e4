"""Seeded tool faults: any environment's tools made as flaky as production's, reproducibly.

``--env 'finqa-lite:1?faults=error=0.1'`` (any environment: the option is taken off before the environment
sees its spec) or ``agentrft eval --faults error=0.1`` wraps the environment in `FaultyEnvironment`. Each tool
call draws, from a generator seeded by (``seed``, the task, which episode of that task, the call's index),
whether it fails and how:

- ``error=P``: the call fails with a tool error the policy sees ("the tool failed: service unavailable");
- ``timeout=P``: the call fails as a timeout would;
- ``truncate=P``: the call runs, and its output is cut to its first half;
- ``malformed=P``: the call runs, and its output is garbled (its characters shuffled);
- ``latency=S``: every call waits an extra exponential delay of mean S seconds (wall time, not tokens);
- ``down=A-B``: calls A to B of the episode (0-based, inclusive) fail as if the tool were down;
- ``tools=a|b``: only these tools (default: all); ``seed=N``: the schedule's seed (default 0).

The schedule is a function of the seed and the episode, so a run replays exactly. Every injected fault is
recorded in the trajectory (``metadata.env.faults``: call index, tool, kind; ``metadata.env.last_call_faulted``).

**What trains.** A fault is an observation the policy must handle: after an error it can call again, or answer
without the tool. So a faulted episode trains like any other, with one exception: an episode whose *last* tool
call the environment ran was faulted and that then ended without an answer (out of turns, tokens or time) had
no turn left to recover in, and is excluded (``Trajectory.untrainable_reason`` = ``injected_fault``): its
failure is the environment's, not the policy's.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrft.envs.base import Environment, EnvironmentWrapper, Episode
from agentrft.inputs import InputError, first_problem
from agentrft.tools.base import ToolResult
from agentrft.types import Message, Task

_RATES = ("error", "timeout", "truncate", "malformed")  # the kinds drawn with a probability each


class FaultSpec(BaseModel):
    """Which faults, how often (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    error: float = Field(default=0.0, ge=0.0, le=1.0)
    timeout: float = Field(default=0.0, ge=0.0, le=1.0)
    truncate: float = Field(default=0.0, ge=0.0, le=1.0)
    malformed: float = Field(default=0.0, ge=0.0, le=1.0)
    latency: float = Field(default=0.0, ge=0.0, le=60.0, description="mean extra seconds per call (exponential)")
    down: tuple[int, int] | None = Field(default=None, description="calls A..B of each episode fail")
    tools: tuple[str, ...] = Field(default=(), description="the tools faults hit (empty: all)")
    seed: int = 0

    @model_validator(mode="after")
    def _at_most_one(self) -> FaultSpec:
        if self.error + self.timeout + self.truncate + self.malformed > 1.0:
            raise ValueError("error + timeout + truncate + malformed is a probability: at most 1")
        return self

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``error=0.1,latency=0.2,down=2-4,tools=calculate|search,seed=3``; one InputError naming what is wrong."""
        fields: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq:
                raise InputError(f"faults {text!r}: expected KEY=VALUE, got {part!r}")
            if key == "down":
                a, dash, b = value.partition("-")
                if not (dash and a.isdigit() and b.isdigit() and int(a) <= int(b)):
                    raise InputError(f"faults {text!r}: down takes A-B (call indices, A <= B), got {value!r}")
                fields["down"] = (int(a), int(b))
            elif key == "tools":
                fields["tools"] = tuple(t for t in value.split("|") if t)
            else:
                fields[key] = value
        try:
            return cls(**fields)
        except ValidationError as exc:
            p = first_problem(exc)
            raise InputError(f"faults {text!r}: {p.field or 'faults'}: {p.message}") from None

    def text(self) -> str:
        parts = [f"{k}={getattr(self, k):g}" for k in (*_RATES, "latency") if getattr(self, k)]
        if self.down is not None:
            parts.append(f"down={self.down[0]}-{self.down[1]}")
        if self.tools:
            parts.append("tools=" + "|".join(self.tools))
        return ",".join(parts + ([f"seed={self.seed}"] if self.seed else [])) or "none"

    def rng(self, task_id: str, episode: int, call: int) -> random.Random:
        """The generator of one call's draws: a function of the seed and the call alone."""
        key = f"{self.seed}\x00{task_id}\x00{episode}\x00{call}".encode()
        return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))

    def draw(self, task_id: str, episode: int, call: int, tool: str) -> tuple[str | None, float]:
        """(the fault kind or None, extra latency) of one call: a function of the seed and the call alone."""
        if self.tools and tool not in self.tools:
            return None, 0.0
        rng = self.rng(task_id, episode, call)
        delay = rng.expovariate(1.0 / self.latency) if self.latency else 0.0
        if self.down is not None and self.down[0] <= call <= self.down[1]:
            return "down", delay
        u, edge = rng.random(), 0.0
        for kind in _RATES:
            edge += getattr(self, kind)
            if u < edge:
                return kind, delay
        return None, delay


_SHOWN = {
    "down": "the tool is down: service unavailable, try again later",
    "error": "the tool failed: internal error",
    "timeout": "the tool timed out",
}


class FaultyEpisode(Episode):
    """An episode whose tool calls go through the fault schedule; the rest is the wrapped episode's."""

    def __init__(self, inner: Episode, spec: FaultSpec, index: int) -> None:
        self.inner, self.spec, self.index = inner, spec, index
        self.task = inner.task
        self.calls = 0
        self.faults: list[dict[str, Any]] = []

    @property
    def finished(self) -> bool:  # type: ignore[override]
        return self.inner.finished

    async def call_tool(self, name: str, arguments: dict[str, Any] | str) -> ToolResult:
        call, self.calls = self.calls, self.calls + 1
        kind, delay = self.spec.draw(self.task.id, self.index, call, name)
        if delay:
            await asyncio.sleep(delay)
        if kind is not None:
            self.faults.append({"call": call, "tool": name, "kind": kind})
        if kind in _SHOWN:
            text = _SHOWN[kind]
            return ToolResult(content=text, error=text, error_kind="timeout" if kind == "timeout" else "fault")
        result = await self.inner.call_tool(name, arguments)
        if kind == "truncate" and result.ok:
            return ToolResult(content=result.content[: len(result.content) // 2], truncated=True)
        if kind == "malformed" and result.ok:
            chars = list(result.content)
            self.spec.rng(self.task.id, self.index, call).shuffle(chars)
            return ToolResult(content="".join(chars))
        return result

    async def reply(self, text: str) -> list[Message] | None:
        return await self.inner.reply(text)

    def outcome(self) -> dict[str, Any]:
        last_faulted = bool(self.faults) and self.faults[-1]["call"] == self.calls - 1
        return {**self.inner.outcome(), "faults": list(self.faults), "last_call_faulted": last_faulted}

    def close(self) -> None:
        self.inner.close()


class FaultyEnvironment(EnvironmentWrapper):
    """``inner`` with its tool calls going through the fault schedule of ``spec``; everything else is inner's."""

    def __init__(self, inner: Environment, spec: FaultSpec) -> None:
        super().__init__(inner)
        self.spec = spec
        self._starts: dict[str, int] = {}  # task id -> episodes started (which episode of the task this is)

    def start(self, task: Task) -> Episode:
        index = self._starts.get(task.id, 0)
        self._starts[task.id] = index + 1
        return FaultyEpisode(self.inner.start(task), self.spec, index)


def with_faults(env: Environment, spec: FaultSpec | str | None) -> Environment:
    """``env`` under a fault schedule (none: ``env`` itself)."""
    if spec is None:
        return env
    spec = FaultSpec.parse(spec) if isinstance(spec, str) else spec
    return FaultyEnvironment(env, spec)
