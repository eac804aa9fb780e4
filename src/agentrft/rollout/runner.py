"""The runner: N tasks × G samples played concurrently on one asyncio loop.

Episodes are independent coroutines, so while some wait on tool calls others
are generating: a batching sampler (HFSampler, vLLM) sees as many concurrent
requests as `max_concurrency` allows and fills its batches from all of them.
The G samples of a task share a `group_id` (the GRPO group), passed to the
sampler as `group_key` so it can prefill the shared prompt once.

Each episode is graded (when a grader is given, through
`graders.agrade_trajectory`: the one grading path) and written to the store as
soon as it finishes, so a crash loses only the episodes in flight. The list
returned is in task order, then sample order, whatever the finishing order.
A runner wall time cancels unfinished episodes and returns the finished ones.

Reproducible by default: with ``seed`` the sampler is reseeded at the start of each run, and in-process
episodes play in lockstep (`rollout.lockstep`: episodes admitted in order, their samples sent in waves), so
the same seed gives the same trajectories token for token on an idle or a busy machine. ``lockstep=False``
lets each request join the sampler's batch the moment it arrives (a little faster; `benchmarks/lockstep.py`).

Who plays an episode: the in-process agent loop (`agent.run_episode`), or an `EpisodePlayer`
such as `agent_command.CommandAgent` (an agent program talking to a served session), which the
runner keeps `running()` while the episodes play.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrft.envs.base import Environment
from agentrft.graders import Grader, agrade_trajectory
from agentrft.rollout.agent import EpisodePrefix, run_episode
from agentrft.rollout.lockstep import Lockstep
from agentrft.samplers.base import ChatSampler, SamplingParams, TokenSampler, is_token_sampler
from agentrft.types import Task, Trajectory, new_id


class TrajectorySink(Protocol):
    def add_trajectory(self, traj: Trajectory) -> str: ...


class EpisodePlayer(Protocol):
    """Plays one episode of a task some other way than the in-process agent loop."""

    def running(self) -> AbstractAsyncContextManager[None]:
        """What must run while episodes play (e.g. the server an agent program talks to)."""
        ...

    async def play(self, task: Task, *, group_id: str, run_id: str, policy_version: int | None) -> Trajectory: ...


@dataclass
class RunStats:
    """Live figures of a run (what the progress bar shows)."""

    started: float = field(default_factory=time.monotonic)
    episodes: int = 0
    generated_tokens: int = 0
    tool_calls: int = 0
    rewards: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    grader_errors: int = 0
    store_errors: list[str] = field(default_factory=list)

    @property
    def elapsed_s(self) -> float:
        return max(time.monotonic() - self.started, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s

    @property
    def tool_calls_per_s(self) -> float:
        return self.tool_calls / self.elapsed_s

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def add(self, traj: Trajectory) -> None:
        self.episodes += 1
        self.generated_tokens += (
            traj.tokens.num_sampled
            if traj.tokens is not None
            else sum(getattr(e, "completion_tokens", 0) for e in traj.events)
        )
        self.tool_calls += len(traj.tool_calls)
        self.statuses[traj.status] = self.statuses.get(traj.status, 0) + 1
        if traj.grade is not None:
            self.rewards.append(traj.grade.reward)
            self.grader_errors += bool(traj.grade.errors)


class Runner:
    """Plays tasks × samples concurrently; grades and stores each episode as it finishes."""

    def __init__(
        self,
        env: Environment,
        sampler: TokenSampler | ChatSampler,
        *,
        store: TrajectorySink | None = None,
        grader: Grader | None = None,
        tool_format: str = "xml",
        params: SamplingParams | None = None,
        max_concurrency: int = 64,
        progress: bool = True,
        wall_time_s: float | None = None,
        player: EpisodePlayer | None = None,
        seed: int | None = None,
        lockstep: bool = True,
        prefixes: Mapping[str, EpisodePrefix] | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.env, self.sampler, self.store, self.grader = env, sampler, store, grader
        self.tool_format = tool_format
        self.params = params or SamplingParams(temperature=1.0, max_tokens=env.limits.max_tokens_per_turn)
        self.max_concurrency = max_concurrency
        self.progress = progress
        self.wall_time_s = wall_time_s
        self.player = player
        self.seed = seed
        # task id -> a recorded episode that task's episodes continue from its turn (`rollout.replay`,
        # `train/rl/branches.py`); other tasks start from the prompt
        self.prefixes: Mapping[str, EpisodePrefix] = prefixes or {}
        # metadata every episode of the following runs carries from the moment it is stored (a training loop
        # sets {"step": N}: a resumed run tells the steps it keeps from those it redoes by it)
        self.tags: dict[str, Any] = {}
        # lockstep applies to the in-process agent loop over a token sampler (not to an agent program's HTTP calls)
        self.lockstep = lockstep and player is None and is_token_sampler(sampler)
        self.stats = RunStats()

    async def _episode(
        self, task: Task, group_id: str, run_id: str, policy_version: int | None, gate: _Gate, index: int, on_done: Any
    ) -> Trajectory:
        async with gate.slot(index) as sampler:
            if self.player is not None:
                traj = await self.player.play(task, group_id=group_id, run_id=run_id, policy_version=policy_version)
            else:
                traj = await run_episode(
                    self.env,
                    sampler,
                    task,
                    params=self.params,
                    tool_format=self.tool_format,
                    run_id=run_id,
                    group_id=group_id,
                    policy_version=policy_version,
                    group_key=group_id,
                    prefix=self.prefixes.get(task.id),
                )
        traj.metadata.update(self.tags)
        if self.grader is not None:
            traj.grade = await agrade_trajectory(self.grader, traj, task.data)
        if self.store is not None:
            try:
                self.store.add_trajectory(traj)
            except Exception as exc:
                self.stats.store_errors.append(f"trajectory {traj.id}: {type(exc).__name__}: {exc}")
        self.stats.add(traj)
        on_done()
        return traj

    async def run(
        self,
        tasks: list[Task],
        samples_per_task: int,
        *,
        run_id: str = "",
        policy_version: int | None = None,
        group_ids: Mapping[str, str] | None = None,
    ) -> list[Trajectory]:
        """Play every task `samples_per_task` times; return the finished trajectories in task, sample order.
        ``group_ids`` (task id -> group id) joins a task's episodes to a group played before (a new one each
        task otherwise)."""
        if samples_per_task < 1:
            raise ValueError(f"samples_per_task must be at least 1, got {samples_per_task}")
        self.stats = RunStats()
        if self.seed is not None and hasattr(self.sampler, "reseed"):
            self.sampler.reseed(self.seed)
        total = len(tasks) * samples_per_task
        gate = _Gate(self.sampler, total, self.max_concurrency, self.lockstep)
        playing = self.player.running() if self.player is not None else contextlib.nullcontext()
        async with playing:
            return await self._run(tasks, samples_per_task, gate, total, run_id, policy_version, group_ids or {})

    async def _run(
        self,
        tasks: list[Task],
        samples_per_task: int,
        gate: _Gate,
        total: int,
        run_id: str,
        policy_version: int | None,
        group_ids: Mapping[str, str],
    ) -> list[Trajectory]:
        with _Progress(self.progress, total, self.stats) as bar:
            jobs: list[asyncio.Task[Trajectory]] = []
            for task in tasks:
                group_id = group_ids.get(task.id) or new_id()
                jobs += [
                    asyncio.create_task(
                        self._episode(task, group_id, run_id, policy_version, gate, len(jobs) + k, bar.tick)
                    )
                    for k in range(samples_per_task)
                ]
            try:
                async with asyncio.timeout(self.wall_time_s):
                    await asyncio.gather(*jobs, return_exceptions=True)
            except TimeoutError:
                pass
            for job in jobs:
                if not job.done():
                    job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)
        failures = [exc for j in jobs if not j.cancelled() and (exc := j.exception()) is not None]
        if failures:
            raise failures[0]  # a bug in the loop itself (model and tool misbehaviour never raise)
        return [j.result() for j in jobs if not j.cancelled()]

    def run_sync(
        self, tasks: list[Task], samples_per_task: int, *, run_id: str = "", policy_version: int | None = None
    ) -> list[Trajectory]:
        return asyncio.run(self.run(tasks, samples_per_task, run_id=run_id, policy_version=policy_version))


class _Gate:
    """How many episodes play at once and which sampler each sees: a semaphore over the shared sampler, or
    in lockstep, admission in episode order and a per-episode view whose samples go out in waves."""

    def __init__(self, sampler: Any, total: int, max_live: int, lockstep: bool) -> None:
        self.sampler = sampler
        self._lockstep = Lockstep(sampler, total, max_live) if lockstep else None
        self._semaphore = asyncio.Semaphore(max_live)

    @contextlib.asynccontextmanager
    async def slot(self, index: int) -> Any:
        """Episode ``index`` (the runner's task, then sample order) plays within this context."""
        if self._lockstep is None:
            async with self._semaphore:
                yield self.sampler
            return
        try:
            await self._lockstep.enter(index)
            yield self._lockstep.view(index)
        finally:
            self._lockstep.leave(index)


class _Progress:
    """A rich progress bar of episodes with tokens/s, tool calls/s and mean reward; silent when disabled."""

    def __init__(self, enabled: bool, total: int, stats: RunStats) -> None:
        self.enabled, self.total, self.stats = enabled, total, stats
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("episodes"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self._bar.start()
            self._task = self._bar.add_task("rollout", total=self.total, info="")
        return self

    def tick(self) -> None:
        if self._bar is None:
            return
        s = self.stats
        reward = "-" if s.mean_reward is None else f"{s.mean_reward:.3f}"
        self._bar.update(
            self._task,
            advance=1,
            info=f"{s.tokens_per_s:,.0f} tok/s  {s.tool_calls_per_s:.1f} tools/s  reward {reward}",
        )

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
