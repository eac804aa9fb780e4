"""The named stages of a GRPO/DAPO step, each a short function the loop calls in order.

rollout (with dynamic sampling) -> grade -> advantages -> pack -> update -> sync.
Each stage takes plain inputs and returns its output and its metrics.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from agentrft.algos import broadcast_turn_advantages, filter_groups, get_advantage_estimator, shape_rewards, turn_level
from agentrft.train.config import AlgorithmConfig, TrainConfig
from agentrft.train.packing import MicroBatch, micro_batches, to_sequence
from agentrft.types import Task, Trajectory


def next_tasks(tasks: Sequence[Task], cursor: int, n: int, seed: int) -> list[Task]:
    """Tasks ``cursor .. cursor+n`` of an endless stream: one seeded shuffle of the task list per epoch."""
    out: list[Task] = []
    size = len(tasks)
    if size == 0:
        raise ValueError("the environment has no training tasks")
    for pos in range(cursor, cursor + n):
        epoch, idx = divmod(pos, size)
        order = list(range(size))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(tasks[order[idx]])
    return out


def grade_stage(trajs: list[Trajectory], tasks_by_id: dict[str, Task], grader: Any, store: Any) -> None:
    """Attach a Grade to every trajectory, concurrently (a crashing grader gives a flagged Grade, never a silent 0)."""
    from agentrft.rollout.runner import grade_episode

    async def _all() -> list[Any]:
        return await asyncio.gather(*(grade_episode(grader, t, tasks_by_id[t.task_id]) for t in trajs))

    for t, grade in zip(trajs, asyncio.run(_all()), strict=True):
        t.grade = grade
        if store is not None:
            store.set_grade(t.id, t.grade)


def group_trajectories(trajs: list[Trajectory]) -> list[list[Trajectory]]:
    """Trajectories grouped by ``group_id``, groups in first-seen order."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    return list(groups.values())


def rollout_stage(
    cfg: TrainConfig, runner: Any, tasks: Sequence[Task], cursor: int, run_id: str, policy_version: int,
    grader: Any, store: Any,
) -> tuple[list[list[Trajectory]], int, dict[str, float]]:
    """Sample and grade groups; with dynamic sampling, keep only groups with signal, sampling more rounds (capped).

    Returns (groups to train on, new cursor, metrics incl. sampling/grading seconds).
    """
    r = cfg.rollout
    ds = cfg.algorithm.dynamic_sampling
    want = r.tasks_per_step
    kept: list[list[Trajectory]] = []
    all_trajs: list[Trajectory] = []
    t_sample = t_grade = 0.0
    rounds = 0
    zero_fracs: list[float] = []
    while True:
        rounds += 1
        batch = next_tasks(tasks, cursor, want if not kept else want - len(kept), cfg.seed)
        cursor += len(batch)
        t0 = time.perf_counter()
        trajs = asyncio.run(runner.run(batch, r.group_size, run_id=run_id, policy_version=policy_version))
        t1 = time.perf_counter()
        grade_stage(trajs, {t.id: t for t in batch}, grader, store)
        t_sample += t1 - t0
        t_grade += time.perf_counter() - t1
        all_trajs += trajs
        groups = group_trajectories(trajs)
        keep, stats = filter_groups([[t.grade.reward for t in g] for g in groups])  # type: ignore[union-attr]
        zero_fracs.append(stats["zero_signal_frac"])
        kept += [groups[i] for i in keep] if ds.enabled else groups
        if not ds.enabled or len(kept) >= want or rounds >= ds.max_rounds:
            break
    metrics = {"zero_signal_frac": zero_fracs[0], "sampling_rounds": float(rounds),
               "groups_trained": float(len(kept[:want] if ds.enabled else kept)),
               "time/sampling_s": t_sample, "time/grading_s": t_grade}
    from agentrft.train.metrics import rollout_metrics

    metrics.update(rollout_metrics(all_trajs, "train"))
    return (kept[:want] if ds.enabled else kept), cursor, metrics


def _num_turns(t: Trajectory) -> int:
    assert t.tokens is not None
    return len({k for k, m in zip(t.tokens.turn, t.tokens.loss_mask, strict=True) if m})


def advantage_stage(groups: list[list[Trajectory]], algo: AlgorithmConfig) -> tuple[list[Trajectory], list[list[float]], dict[str, float]]:
    """Per-token advantages for every trainable trajectory (those with a token record)."""
    trajs = [t for g in groups for t in g if t.tokens is not None]
    if not trajs:
        return [], [], {}
    group_ids = {gid: i for i, gid in enumerate(dict.fromkeys(t.group_id for t in trajs))}
    index = torch.tensor([group_ids[t.group_id] for t in trajs], dtype=torch.int64)
    rewards = torch.tensor([t.grade.reward for t in trajs], dtype=torch.float64)  # type: ignore[union-attr]
    metrics: dict[str, float] = {}
    if algo.overlong.enabled:
        o = algo.overlong
        lengths = torch.tensor([t.tokens.num_sampled for t in trajs])  # type: ignore[union-attr]
        rewards, m = shape_rewards(rewards, lengths, max_len=o.max_len, cache_len=o.cache_len, penalty=o.penalty)
        metrics.update(m)
    adv, m = get_advantage_estimator(algo.advantage)(rewards, index, eps=algo.adv_eps)
    metrics.update(m)
    per_token: list[list[float]] = []
    if algo.turn_level:
        missing = [t.id for t in trajs if t.grade is None or t.grade.turn_rewards is None]
        if missing:
            raise ValueError(f"algorithm.turn_level is on but trajectories {missing[:3]} have no grade.turn_rewards; "
                             "use a grader that gives per-turn rewards or turn turn_level off")
        turn_adv, m = turn_level(adv, [t.grade.turn_rewards for t in trajs], [_num_turns(t) for t in trajs],  # type: ignore[union-attr,misc]
                                 index, turn_weight=algo.turn_weight, eps=algo.adv_eps)
        metrics.update(m)
        for t, ta in zip(trajs, turn_adv, strict=True):
            assert t.tokens is not None
            per_token.append(broadcast_turn_advantages(ta, torch.tensor(t.tokens.turn), torch.tensor(t.tokens.loss_mask)).tolist())
    else:
        for t, a in zip(trajs, adv.tolist(), strict=True):
            assert t.tokens is not None
            per_token.append([a * m for m in t.tokens.loss_mask])
    return trajs, per_token, metrics


def pack_stage(trajs: list[Trajectory], per_token: list[list[float]], cfg: TrainConfig, pad_id: int) -> list[MicroBatch]:
    seqs = [to_sequence(i, t, a) for i, (t, a) in enumerate(zip(trajs, per_token, strict=True))
            if t.tokens is not None and t.tokens.num_sampled > 0]
    o = cfg.optimizer
    if o.shared_prefix:
        from agentrft.train.shared_prefix import shared_prefix_micro_batches

        return shared_prefix_micro_batches(seqs, o.micro_batch_tokens, o.shared_prefix_row_tokens, pad_id)
    return micro_batches(seqs, o.micro_batch_tokens, pad_id)
