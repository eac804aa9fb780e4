"""Rejection-sampling fine-tuning (``method: rejection_sampling``, preset ``rejection-sampling``) on the training core.

RFT (Yuan et al., arXiv 2308.01825) / ReST^EM (Singh et al., arXiv 2312.06585): sample
with the current policy, keep what the grader accepts, fine-tune on it, repeat. Here a
round is ``rejection_sampling.steps_per_round`` steps of one session: its first step
collects (``tasks_per_round`` tasks of ``rollout.split`` drawn by the task cursor, as
GRPO draws them; ``rollout.group_size`` episodes each; graded through the one grading
path), keeps what ``data``'s filters keep (`data.filter_trajectories`: e.g. success only,
best of n = 1 per task), and every step of the round is an SFT step (`sft.train_stage`)
on ``sft.batch_size`` kept trajectories, drawn as an endless seeded shuffle of the round's
pool. Departures from the papers: rounds continue one optimiser and schedule rather than
restarting from the base model each iteration (ReST^EM restarts), and a round whose
samples all fail trains nothing (``update_skipped``) rather than sampling again.

Exact resume: the round's pool (trajectory ids, stored in the run's store as they were
sampled) and its draw cursor are in the checkpoint's ``state.extra``; sampling is seeded
by step, as in GRPO.
"""

from __future__ import annotations

import time

from agentrft.envs.base import Environment
from agentrft.graders import Grader
from agentrft.memory import trim
from agentrft.samplers.base import TrainablePolicy
from agentrft.store import Store
from agentrft.train.config import TrainConfig
from agentrft.train.core.metrics import rollout_metrics
from agentrft.train.core.session import Session, StepFn
from agentrft.train.data import filter_trajectories
from agentrft.train.data.records import learnable_records
from agentrft.train.data.sft import Evaluate, train_stage
from agentrft.train.rl.stages import grade_stage, next_tasks, rollout_stage, train_runner
from agentrft.types import Trajectory

POOL, POOL_CURSOR = "rejection_pool", "rejection_pool_cursor"  # keys of state.extra


def rejection_sampling_step(
    cfg: TrainConfig,
    env: Environment,
    policy: TrainablePolicy,
    grader: Grader,
    store: Store | None,
    session: Session,
    evaluate: Evaluate,
) -> StepFn:
    """One step: (first step of a round: rollout -> grade -> keep) -> draw -> pack -> update -> sync -> (eval)."""
    if store is None:
        raise ValueError("rejection_sampling keeps each round's samples in the run's store; it needs one")
    rs, state = cfg.rejection_sampling, session.state
    tasks = env.tasks(cfg.rollout.split)
    if cfg.eval.every_steps:
        env.tasks(cfg.eval.split)  # a bad eval split fails now, not after hours of training
    runner = train_runner(cfg, env, policy, store)
    pool: list[Trajectory] = [store.get_trajectory(i) for i in state.extra.get(POOL, [])]  # resumed mid-round

    def collect(step: int) -> dict[str, float]:
        policy.reseed(cfg.seed * 1_000_003 + step)  # sampling does not depend on this process's history
        runner.tags["step"] = step  # what a resume keeps (train/core/resume.py)
        session.model.eval()
        batch = next_tasks(tasks, state.cursor, rs.tasks_per_round, cfg.seed)
        state.cursor += len(batch)
        t0 = time.perf_counter()
        trajs = rollout_stage(runner, batch, cfg.rollout.group_size, session.run_id, state.policy_version)
        t1 = time.perf_counter()
        grade_stage(trajs, {t.id: t for t in batch}, grader, store)
        trim()  # the rollout's KV caches were freed in the engine thread's arena
        kept, counts = filter_trajectories(trajs, cfg.data)
        kept, _ = learnable_records(kept, renderer=None, tool_format=cfg.rollout.tool_format, tool_schemas=[])
        pool[:] = kept
        state.extra[POOL], state.extra[POOL_CURSOR] = [t.id for t in kept], 0
        metrics = rollout_metrics(trajs, "train")
        metrics.update({f"rejection/kept_after/{k}": float(v) for k, v in counts.items()})
        metrics["rejection/kept"] = float(len(kept))
        metrics["rejection/tasks_kept"] = float(len({t.task_id for t in kept}))
        metrics["time/sampling_s"], metrics["time/grading_s"] = t1 - t0, time.perf_counter() - t1
        return metrics

    def step_fn(step: int) -> dict[str, float]:
        metrics: dict[str, float] = {}
        round_index = (step - 1) // rs.steps_per_round
        if (step - 1) % rs.steps_per_round == 0:
            metrics.update(collect(step))
        batch: list[Trajectory] = []
        if pool:
            cursor = int(state.extra.get(POOL_CURSOR, 0))
            batch = next_tasks(pool, cursor, cfg.sft.batch_size, cfg.seed + round_index)
            state.extra[POOL_CURSOR] = cursor + len(batch)
        metrics.update(train_stage(cfg, policy, session, batch))
        metrics["rejection/round"] = float(round_index + 1)
        metrics.update(evaluate(step))
        return metrics

    return step_fn
