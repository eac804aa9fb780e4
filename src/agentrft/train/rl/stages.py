"""The named stages of a GRPO/DAPO step, each a short function the loop calls in order.

rollout -> grade -> filter (repeated while dynamic sampling wants more groups: `collect_stage`)
-> advantages -> (skip the zero-advantage trajectories: `skip_zero_advantage`) -> pack; the update and
the sync are in `update.py` and `loop.py`.
Each stage takes plain inputs and returns its output and its metrics.

Errors never train: `filter_stage` takes out every trajectory that
`Trajectory.untrainable_reason` names (an episode error, a grader error, no grade,
no token record) before any group statistic is computed, so a crashing judge
cannot move its siblings' advantages; a group left with fewer than two members
is dropped. Both are counted per cause in the step metrics (``excluded/...``,
``groups_dropped/...``).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import torch

from agentrft.algos import broadcast_turn_advantages, get_advantage_estimator, is_zero_signal, shape_rewards, turn_level
from agentrft.envs.base import Environment
from agentrft.graders import Grader, agrade_trajectories
from agentrft.rollout.agent_command import AgentCommandConfig, CommandAgent
from agentrft.rollout.runner import Runner
from agentrft.rollout.serve_request import ServeLimits
from agentrft.samplers.base import SamplingParams, TokenSampler
from agentrft.store import Store
from agentrft.train.config import TrainConfig
from agentrft.train.config.algorithm import AlgorithmConfig
from agentrft.train.core.metrics import rollout_metrics
from agentrft.train.core.packing import MicroBatch, PackedSequence, micro_batches, to_sequences
from agentrft.types import Task, Trajectory

if TYPE_CHECKING:
    from agentrft.train.rl.curriculum import TaskSource

T = TypeVar("T")
MIN_GROUP = 2  # a group statistic (mean, std, leave-one-out) needs at least two healthy members


def next_tasks(
    tasks: Sequence[T], cursor: int, n: int, seed: int, groups: Sequence[int] | None = None, chunk: int = 1
) -> list[T]:
    """Items ``cursor .. cursor+n`` of an endless stream: one seeded shuffle of the list per epoch. GRPO draws
    its tasks this way, SFT its trajectories and DPO its pairs; the cursor in the checkpoint makes a resumed
    run draw the same. ``groups`` (one key per item): each epoch's order is `grouped_order`'s, in runs of
    ``chunk`` items of one group as far as the groups' sizes allow (SFT: chunk = batch size)."""
    out: list[T] = []
    size = len(tasks)
    if size == 0:
        raise ValueError("nothing to draw from (no training tasks, or an empty selection)")
    orders: dict[int, list[int]] = {}
    for pos in range(cursor, cursor + n):
        epoch, idx = divmod(pos, size)
        if epoch not in orders:
            order = list(range(size))
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
            if groups is not None:
                order = grouped_order(order, groups, chunk, random.Random(f"{seed}:{epoch}:groups"))
            orders[epoch] = order
        out.append(tasks[orders[epoch][idx]])
    return out


def grouped_order(order: list[int], groups: Sequence[int], n: int, rng: random.Random) -> list[int]:
    """``order`` (a shuffle of item indices) regrouped into runs of ``n`` items of one group: each group's
    items are cut, in shuffled order, into chunks of ``n``; the chunks are shuffled; the groups' remainders
    (fewer than ``n`` each) come last, together. A permutation of ``order``."""
    by_group: dict[int, list[int]] = {}
    for i in order:
        by_group.setdefault(groups[i], []).append(i)
    chunks: list[list[int]] = []
    rest: list[int] = []
    for members in by_group.values():
        whole = len(members) - len(members) % n
        chunks += [members[k : k + n] for k in range(0, whole, n)]
        rest += members[whole:]
    rng.shuffle(chunks)
    return [i for chunk in chunks for i in chunk] + rest


def train_runner(cfg: TrainConfig, env: Environment, policy: TokenSampler, store: Store | None) -> Runner:
    """The runner that samples training episodes: the rollout config's distribution and tool format."""
    r = cfg.rollout
    params = SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens)
    player = None if cfg.agent is None else command_agent(cfg.agent, env, policy, params, r.tool_format)
    return Runner(
        env,
        policy,
        store=store,
        tool_format=r.tool_format,
        progress=False,
        params=params,
        player=player,
        lockstep=r.lockstep,
    )


def command_agent(
    agent: AgentCommandConfig, env: Environment, policy: TokenSampler, params: SamplingParams, tool_format: str
) -> CommandAgent:
    """The agent program as the runner's episode player, served the policy within its context."""
    from agentrft.samplers.inprocess import InProcessPolicy

    context = policy.max_positions if isinstance(policy, InProcessPolicy) else None
    limits = ServeLimits(context_tokens=context, max_tokens_limit=max(4096, params.max_tokens))
    return CommandAgent(agent, env, policy, params=params, tool_format=tool_format, limits=limits)


def rollout_stage(
    runner: Runner, tasks: list[Task], group_size: int, run_id: str, policy_version: int
) -> list[Trajectory]:
    """Play ``group_size`` episodes of each task (one group each); each is stored as it finishes."""
    return asyncio.run(runner.run(tasks, group_size, run_id=run_id, policy_version=policy_version))


def is_expert(t: Trajectory) -> bool:
    """An episode the environment's expert played into a policy group (``rollout.expert_per_group``)."""
    return bool(t.metadata.get("expert"))


def guided_rollout_stage(
    runner: Runner,
    expert: Runner | None,
    tasks: list[Task],
    group_size: int,
    expert_per_group: int,
    run_id: str,
    policy_version: int,
    store: Store | None,
) -> list[Trajectory]:
    """`rollout_stage`, with ``expert_per_group`` of each group's ``group_size`` episodes played by the
    environment's expert (`expert`, an oracle runner) into the same group: guided groups.

    Where a task's policy episodes all fail, or all take the same wrong turn, the group has no signal; an expert
    episode in it is a success the group is normalised with, so its tokens get a positive advantage and the
    policy's failures a negative one (off-policy guidance, as LUFFY, Yan et al., arXiv 2504.14945, mixes
    expert traces into GRPO groups). The expert writes through the policy's own chat template and tool format,
    so its token record is what the policy would have had to sample; its tokens train like the policy's
    (synchronous loop: the ratio's denominator is the trainer's own log-prob, so there is no sampler log-prob to
    correct by, and the config refuses asynchronous rollouts and an off-policy correction; the in-memory record's
    sampler log-probs are NaN, so the trainer's sampler gap leaves them out). Expert episodes are flagged ``metadata.expert``
    and kept out of the pass rates the curriculum and the metrics report (`collect_stage`)."""
    trajs = rollout_stage(runner, tasks, group_size - expert_per_group, run_id, policy_version)
    if expert is None or not expert_per_group:
        return trajs
    groups = {t.task_id: t.group_id for t in trajs}
    guided = asyncio.run(
        expert.run(tasks, expert_per_group, run_id=run_id, policy_version=policy_version, group_ids=groups)
    )
    for t in guided:
        t.metadata["expert"] = True
        if t.tokens is not None:  # no sampler drew these tokens: the trainer's sampler gap leaves them out
            t.tokens.logprobs = [math.nan] * len(t.tokens.logprobs)
    if store is not None:
        store.update_metadata({t.id: {"expert": True} for t in guided})
    return trajs + guided


def grade_stage(trajs: list[Trajectory], tasks_by_id: dict[str, Task], grader: Grader, store: Store | None) -> None:
    """Attach a Grade to every trajectory through `graders.agrade_trajectories` (the one grading path:
    a crashing grader gives a flagged Grade), and store it."""
    grades = asyncio.run(agrade_trajectories(grader, trajs, [tasks_by_id[t.task_id].data for t in trajs]))
    for t, grade in zip(trajs, grades, strict=True):
        t.grade = grade
        if store is not None:
            store.set_grade(t.id, grade)


def group_trajectories(trajs: list[Trajectory]) -> list[list[Trajectory]]:
    """Trajectories grouped by ``group_id``, groups in first-seen order."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(t)
    return list(groups.values())


@dataclass
class Filtered:
    """What `filter_stage` kept, and why the rest left (counts accumulate over sampling rounds)."""

    groups: list[list[Trajectory]] = field(default_factory=list)
    excluded: Counter[str] = field(default_factory=Counter)  # trajectories by cause
    grader_flags: Counter[str] = field(default_factory=Counter)  # excluded trajectories' grader error flags
    dropped: Counter[str] = field(default_factory=Counter)  # groups by cause
    groups_seen: int = 0
    zero_signal: int = 0  # groups (of >= MIN_GROUP healthy members) whose rewards all agree, dropped or not

    def metrics(self) -> dict[str, float]:
        out = {f"excluded/{k}": float(v) for k, v in sorted(self.excluded.items())}
        out.update({f"excluded/grader_error/{k}": float(v) for k, v in sorted(self.grader_flags.items())})
        out.update({f"groups_dropped/{k}": float(v) for k, v in sorted(self.dropped.items())})
        out["excluded_trajectories"] = float(sum(self.excluded.values()))
        out["zero_signal_frac"] = self.zero_signal / self.groups_seen if self.groups_seen else 0.0
        return out


def filter_stage(trajs: list[Trajectory], *, drop_zero_signal: bool, into: Filtered | None = None) -> Filtered:
    """Keep the healthy members of each group; drop groups left with fewer than `MIN_GROUP` of them and,
    with dynamic sampling (``drop_zero_signal``), groups whose healthy rewards all agree."""
    out = into if into is not None else Filtered()
    for group in group_trajectories(trajs):
        out.groups_seen += 1
        healthy = []
        for t in group:
            reason = t.untrainable_reason()
            if reason is None:
                healthy.append(t)
                continue
            out.excluded[reason] += 1
            if reason == "grader_error":
                assert t.grade is not None
                out.grader_flags.update({e.flag for e in t.grade.errors})
        if len(healthy) < MIN_GROUP:
            out.dropped["too_small"] += 1
            out.excluded["small_group"] += len(healthy)
            continue
        flat = is_zero_signal([t.grade.reward for t in healthy])  # type: ignore[union-attr]
        out.zero_signal += flat
        if flat and drop_zero_signal:
            out.dropped["zero_signal"] += 1
        else:
            out.groups.append(healthy)
    return out


def drop_reasons(trajs: Sequence[Trajectory], kept: set[str]) -> dict[str, str]:
    """Why each trajectory of ``trajs`` not in ``kept`` (ids) will not train: its own fault
    (`Trajectory.untrainable_reason`), else its group's (``small_group``: fewer than `MIN_GROUP` healthy
    members; ``zero_signal``: dropped by dynamic sampling). Stored as ``metadata.dropped``."""
    out: dict[str, str] = {}
    for group in group_trajectories(list(trajs)):
        healthy = sum(t.untrainable_reason() is None for t in group)
        for t in group:
            if t.id not in kept:
                out[t.id] = t.untrainable_reason() or ("small_group" if healthy < MIN_GROUP else "zero_signal")
    return out


def collect_stage(
    cfg: TrainConfig,
    runner: Runner,
    source: TaskSource,
    cursor: int,
    run_id: str,
    policy_version: int,
    grader: Grader,
    store: Store | None,
    expert: Runner | None = None,
) -> tuple[list[list[Trajectory]], int, dict[str, float]]:
    """rollout -> grade -> filter, repeated while dynamic sampling still wants groups (capped rounds). Tasks
    come from ``source`` (`train/rl/curriculum.py`), which sees every graded policy episode before the next round
    draws; with ``rollout.expert_per_group``, `expert` plays that many of each group (`guided_rollout_stage`).

    Returns (groups to train on, new task cursor, metrics incl. sampling/grading seconds and exclusions).
    """
    r, ds = cfg.rollout, cfg.algorithm.dynamic_sampling
    if r.expert_per_group and expert is None:
        raise ValueError("rollout.expert_per_group: the loop was given no expert to play guided episodes")
    kept = Filtered()
    all_trajs: list[Trajectory] = []
    t_sample = t_grade = 0.0
    rounds = 0
    while True:
        rounds += 1
        batch = source.draw(cursor, r.tasks_per_step - len(kept.groups))
        cursor += len(batch)
        t0 = time.perf_counter()
        trajs = guided_rollout_stage(
            runner, expert, batch, r.group_size, r.expert_per_group, run_id, policy_version, store
        )
        t1 = time.perf_counter()
        grade_stage(trajs, {t.id: t for t in batch}, grader, store)
        source.observe([t for t in trajs if not is_expert(t)])  # the policy's pass rates, not the expert's
        t_sample += t1 - t0
        t_grade += time.perf_counter() - t1
        all_trajs += trajs
        filter_stage(trajs, drop_zero_signal=ds.enabled, into=kept)
        if store is not None:  # every trajectory says whether it will train (the update marks trained_step)
            dropped = drop_reasons(trajs, {t.id for g in kept.groups for t in g})
            if dropped:
                store.update_metadata({tid: {"dropped": why} for tid, why in dropped.items()})
        if not ds.enabled or len(kept.groups) >= r.tasks_per_step or rounds >= ds.max_rounds:
            break
    metrics = {
        "sampling_rounds": float(rounds),
        "groups_trained": float(len(kept.groups)),
        "time/sampling_s": t_sample,
        "time/grading_s": t_grade,
        **kept.metrics(),
    }
    metrics.update(rollout_metrics([t for t in all_trajs if not is_expert(t)], "train"))
    experts = [t for t in all_trajs if is_expert(t)]
    if experts:
        metrics.update(rollout_metrics(experts, "expert"))
    metrics.update(source.metrics())
    return kept.groups, cursor, metrics


def _num_turns(t: Trajectory) -> int:
    assert t.tokens is not None
    return len({k for k, m in zip(t.tokens.turn, t.tokens.loss_mask, strict=True) if m})


def turn_states(t: Trajectory) -> list[bytes]:
    """The state each assistant turn of ``t`` acted from: a digest of every token before the turn's first sampled
    one (prompt, earlier turns, tool results), so two turns share a state exactly when their histories are the
    same tokens (`algos.turn_level`'s anchor states)."""
    assert t.tokens is not None
    out: list[bytes] = []
    seen: set[int] = set()
    history = hashlib.blake2b(digest_size=16)  # fed token by token: one pass over the episode
    for tok, k, m in zip(t.tokens.ids, t.tokens.turn, t.tokens.loss_mask, strict=True):
        if m and k not in seen:
            seen.add(k)
            out.append(history.copy().digest())
        history.update(tok.to_bytes(4, "little"))
    return out


def advantage_stage(
    groups: list[list[Trajectory]], algo: AlgorithmConfig
) -> tuple[list[Trajectory], list[list[float]], dict[str, float]]:
    """Per-token advantages for every trajectory of ``groups`` (healthy ones: see `filter_stage`)."""
    trajs = [t for g in groups for t in g]
    if not trajs:
        return [], [], {}
    unhealthy = [t.id for t in trajs if t.untrainable_reason() is not None]
    if unhealthy:
        raise ValueError(f"trajectories {unhealthy[:3]} cannot be trained on; filter_stage removes them")
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
        turn_rewards: list[list[float]] = []
        missing: list[str] = []
        for t in trajs:
            if t.grade is None or t.grade.turn_rewards is None:
                missing.append(t.id)
            else:
                turn_rewards.append(t.grade.turn_rewards)
        if missing:
            raise ValueError(
                f"algorithm.turn_level is on but trajectories {missing[:3]} have no grade.turn_rewards; "
                "use a grader that gives per-turn rewards or turn turn_level off"
            )
        turn_adv, m = turn_level(
            adv,
            turn_rewards,
            [_num_turns(t) for t in trajs],
            index,
            states=[turn_states(t) for t in trajs],
            turn_weight=algo.turn_weight,
            eps=algo.adv_eps,
        )
        metrics.update(m)
        for t, ta in zip(trajs, turn_adv, strict=True):
            assert t.tokens is not None
            per_token.append(
                broadcast_turn_advantages(ta, torch.tensor(t.tokens.turn), torch.tensor(t.tokens.loss_mask)).tolist()
            )
    else:
        for t, a in zip(trajs, adv.tolist(), strict=True):
            assert t.tokens is not None
            per_token.append([a * m for m in t.tokens.loss_mask])
    return trajs, per_token, metrics


def skip_zero_advantage(
    trajs: list[Trajectory], per_token: list[list[float]], algo: AlgorithmConfig
) -> tuple[list[Trajectory], list[list[float]], tuple[int, int]]:
    """The trajectories worth a forward and backward: those with a non-zero advantage on some trained token,
    and the (loss tokens, sequences) of the rest, which the update still counts in its denominators.

    Exact: with no KL term (``algo.kl_coef`` 0) a token of advantage 0 has loss 0 and gradient 0 under every
    aggregation and importance weight, so computing it changes nothing but the time. (A group whose episodes
    all came out the same, common once a policy is confident: three of the four groups of some of the
    agentic recipe's RL steps.) With a KL term nothing is skipped."""
    if algo.kl_coef > 0:
        return trajs, per_token, (0, 0)
    kept: list[Trajectory] = []
    kept_adv: list[list[float]] = []
    tokens = seqs = 0
    for t, a in zip(trajs, per_token, strict=True):
        if t.tokens is not None and t.tokens.num_sampled > 0 and not any(a):
            for seq in to_sequences(0, t, a):
                tokens, seqs = tokens + seq.num_loss_tokens, seqs + 1
        else:
            kept.append(t)
            kept_adv.append(a)
    return kept, kept_adv, (tokens, seqs)


def pack_stage(
    trajs: list[Trajectory], per_token: list[list[float]], cfg: TrainConfig, pad_id: int
) -> list[MicroBatch]:
    seqs: list[PackedSequence] = []
    for t, a in zip(trajs, per_token, strict=True):
        if t.tokens is not None and t.tokens.num_sampled > 0:
            seqs += to_sequences(len(seqs), t, a)  # a stitched session's segments: one sequence each
    o = cfg.optimizer
    if o.shared_prefix:
        from agentrft.train.core.shared_prefix import shared_prefix_micro_batches

        return shared_prefix_micro_batches(
            seqs,
            o.micro_batch_tokens,
            o.shared_prefix_row_tokens,
            pad_id,
            layout=o.shared_prefix_layout,
            context_grad=o.context_grad,
        )
    return micro_batches(seqs, o.micro_batch_tokens, pad_id)
