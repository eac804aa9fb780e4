"""Grading whole trajectories (cost, tool-schema drift), batches, and metric summaries."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from agentrft.graders.base import Grader, Sample
from agentrft.types import Cost, Grade, GradeError, ModelCallEvent, Trajectory

DRIFT_FLAG = "tool_schema_drift"


def trajectory_cost(traj: Trajectory) -> Cost:
    """Tokens from ModelCallEvents, number of tool calls, wall seconds (finished - created, else latencies)."""
    prompt = completion = 0
    latency = 0.0
    for e in traj.events:
        if isinstance(e, ModelCallEvent):
            prompt += e.prompt_tokens
            completion += e.completion_tokens
            latency += e.latency_s
    tool_latency = sum(e.latency_s for e in traj.tool_calls)
    seconds = traj.finished_at - traj.created_at if traj.finished_at is not None else latency + tool_latency
    return Cost(
        prompt_tokens=prompt, completion_tokens=completion, tool_calls=len(traj.tool_calls), seconds=max(0.0, seconds)
    )


def _finish(grade: Grade, grader: Grader, traj: Trajectory, expected_hash: str | None) -> Grade:
    grade.cost = trajectory_cost(traj)
    if expected_hash is not None and traj.env.tool_schema_hash != expected_hash:
        # Reward is kept (the episode was graded as played) but the drift is a counted error flag.
        grade.errors = [
            *grade.errors,
            GradeError(
                flag=DRIFT_FLAG,
                grader=grader.name,
                message=f"trajectory tool_schema_hash {traj.env.tool_schema_hash!r} != expected {expected_hash!r}",
            ),
        ]
    return grade


def grade_trajectory(
    grader: Grader, traj: Trajectory, item: dict[str, Any], *, expected_tool_schema_hash: str | None = None
) -> Grade:
    """Grade an agent episode; fills `cost` and flags `tool_schema_drift` when the tool schemas changed.

    A drift flag does not change reward or success: the episode is graded as
    played; the flag makes the mismatch visible in error counts.
    """
    return _finish(grader.grade(Sample.from_trajectory(traj), item), grader, traj, expected_tool_schema_hash)


async def agrade_trajectory(
    grader: Grader, traj: Trajectory, item: dict[str, Any], *, expected_tool_schema_hash: str | None = None
) -> Grade:
    grade = await grader.agrade(Sample.from_trajectory(traj), item)
    return _finish(grade, grader, traj, expected_tool_schema_hash)


async def agrade_trajectories(
    grader: Grader,
    trajs: Sequence[Trajectory],
    items: Sequence[dict[str, Any]],
    *,
    concurrency: int = 16,
    expected_tool_schema_hash: str | None = None,
) -> list[Grade]:
    """`agrade_trajectory` over many episodes, concurrently (judges and sandboxes overlap); input order.
    Never raises for a grader failure: every failure is an error flag on its Grade. With
    ``expected_tool_schema_hash`` (stored episodes graded by the environment as it is now), an episode played
    with other tool schemas is flagged ``tool_schema_drift``, so it never trains."""
    if len(trajs) != len(items):
        raise ValueError(f"{len(trajs)} trajectories but {len(items)} items")
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(t: Trajectory, item: dict[str, Any]) -> Grade:
        async with sem:
            return await agrade_trajectory(grader, t, item, expected_tool_schema_hash=expected_tool_schema_hash)

    return list(await asyncio.gather(*(one(t, i) for t, i in zip(trajs, items, strict=True))))


async def agrade_many(
    grader: Grader, pairs: Sequence[tuple[Any, dict[str, Any]]], *, concurrency: int = 16
) -> list[Grade]:
    """Grade (sample, item) pairs concurrently; results in input order."""
    if not grader.is_async:
        return [grader.grade(s, i) for s, i in pairs]
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(s: Any, i: dict[str, Any]) -> Grade:
        async with sem:
            return await grader.agrade(s, i)

    return list(await asyncio.gather(*(one(s, i) for s, i in pairs)))


def summarize_grades(grades: Iterable[Grade]) -> dict[str, Any]:
    """Aggregate for training/eval metrics.

    Returns `n`, `reward_mean`, `success_rate`, `error_count` (grades with at
    least one error), `error_rate`, `sub_reward_mean` per grader (errored
    sub-rewards, recorded as None, are excluded from the mean and counted
    instead), `errors_by_grader` {grader: {flag: count}} and `errors_by_flag`.
    """
    grades = list(grades)
    n = len(grades)
    sums: dict[str, float] = defaultdict(float)
    counts: Counter[str] = Counter()
    by_grader: dict[str, Counter[str]] = defaultdict(Counter)
    by_flag: Counter[str] = Counter()
    for g in grades:
        for k, v in g.sub_rewards.items():
            if v is not None:
                sums[k] += v
                counts[k] += 1
        for e in g.errors:
            by_grader[e.grader][e.flag] += 1
            by_flag[e.flag] += 1
    errored = sum(1 for g in grades if g.errors)
    return {
        "n": n,
        "reward_mean": sum(g.reward for g in grades) / n if n else None,
        "success_rate": sum(1 for g in grades if g.success) / n if n else None,
        "error_count": errored,
        "error_rate": errored / n if n else None,
        "sub_reward_mean": {k: sums[k] / counts[k] for k in sorted(counts)},
        "errors_by_grader": {k: dict(v) for k, v in sorted(by_grader.items())},
        "errors_by_flag": dict(sorted(by_flag.items())),
    }
