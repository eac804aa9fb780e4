import math
import random

import pytest
from conftest import fake_trajectory

from agentrft.train.config.algorithm import AlgorithmConfig
from agentrft.train.rl.stages import (
    advantage_stage,
    filter_stage,
    group_trajectories,
    grouped_order,
    next_tasks,
    turn_states,
)
from agentrft.types import Grade, GradeError, Message, Task, TokenRecord, Trajectory


def test_next_tasks_is_a_deterministic_endless_shuffle():
    tasks = [Task(id=str(i), messages=[Message(role="user", content="q")]) for i in range(5)]
    first = [t.id for t in next_tasks(tasks, 0, 5, seed=1)]
    assert sorted(first) == ["0", "1", "2", "3", "4"]  # one epoch = every task once
    assert [t.id for t in next_tasks(tasks, 2, 5, seed=1)][:3] == first[2:]  # a cursor resumes the stream
    assert [t.id for t in next_tasks(tasks, 0, 5, seed=1)] == first
    with pytest.raises(ValueError, match="no training tasks"):
        next_tasks([], 0, 1, seed=0)


def test_grouped_draws_take_a_batch_from_one_group_and_still_cover_every_item_once_per_epoch():
    items = list(range(27))
    groups = [i % 3 for i in items]  # three groups of 9: with batches of 4, two whole chunks each, 3 left over
    epoch = next_tasks(items, 0, 27, seed=5, groups=groups, chunk=4)
    assert sorted(epoch) == items
    chunks = [epoch[k : k + 4] for k in range(0, 24, 4)]
    assert all(len({groups[i] for i in chunk}) == 1 for chunk in chunks)  # six batches, each of one group
    assert sorted(groups[i] for i in epoch[24:]) == [0, 1, 2]  # the remainders, together at the end
    # a function of (seed, cursor): a resumed draw is the uninterrupted one's, across the epoch boundary too
    stream = next_tasks(items, 0, 60, seed=5, groups=groups, chunk=4)
    assert next_tasks(items, 22, 30, seed=5, groups=groups, chunk=4) == stream[22:52]
    assert sorted(stream[27:54]) == items and stream[27:54] != epoch  # the next epoch: another grouping
    plain = next_tasks(items, 0, 27, seed=5)
    assert plain != epoch and sorted(plain) == items


def test_grouped_order_is_a_permutation_of_any_order():
    rng = random.Random(0)
    for _ in range(50):
        n_items, n = rng.randint(1, 40), rng.randint(1, 9)
        order = list(range(n_items))
        rng.shuffle(order)
        groups = [rng.randint(0, 4) for _ in range(n_items)]
        out = grouped_order(order, groups, n, random.Random(1))
        assert sorted(out) == list(range(n_items))
        whole = n_items - sum(groups.count(g) % n for g in set(groups))
        assert all(len({groups[i] for i in out[k : k + n]}) == 1 for k in range(0, whole, n))


def _group(rewards, turns=2, turn_rewards=None):
    rng = random.Random(7)
    out = []
    for i, r in enumerate(rewards):
        t = fake_trajectory(rng, turns=turns, group="g")
        t.grade = Grade(reward=r, turn_rewards=None if turn_rewards is None else turn_rewards[i])
        out.append(t)
    return out


def test_outcome_advantage_on_sampled_tokens_only():
    group = _group([1.0, 0.0])
    trajs, per_token, _ = advantage_stage(group_trajectories(group), AlgorithmConfig(advantage="grpo", adv_eps=1e-6))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    for t, adv, sign in zip(trajs, per_token, (1, -1), strict=True):
        assert adv == pytest.approx([sign * a * m for m in t.tokens.loss_mask], rel=1e-12, abs=1e-15)


def _episode(turns: list[list[int]], tool: list[int], prompt: list[int]) -> Trajectory:
    """A prompt, then each turn's sampled tokens followed by the tool result ``tool`` (none after the last)."""
    ids, mask, turn = list(prompt), [0] * len(prompt), [0] * len(prompt)
    for k, sampled in enumerate(turns):
        if k:
            ids += tool
            mask += [0] * len(tool)
            turn += [k] * len(tool)
        ids += sampled
        mask += [1] * len(sampled)
        turn += [k] * len(sampled)
    return Trajectory(
        task_id="t", group_id="g", tokens=TokenRecord(ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids), turn=turn)
    )


def test_turn_states_are_the_histories_before_each_turn():
    a = _episode([[5, 6], [7]], tool=[9, 9], prompt=[1, 2, 3])
    b = _episode([[5, 6], [8, 8]], tool=[9, 9], prompt=[1, 2, 3])
    c = _episode([[5], [7]], tool=[9, 9], prompt=[1, 2, 3])
    sa, sb, sc = turn_states(a), turn_states(b), turn_states(c)
    assert len(sa) == 2 and sa == sb  # same prompt, same first turn, same tool result: same two states
    assert sc[0] == sa[0] and sc[1] != sa[1]  # another first turn: another state after it
    assert turn_states(_episode([[5, 6]], tool=[], prompt=[1, 2, 4]))[0] != sa[0]


def test_turn_level_through_the_stage():
    # one prompt, two first turns: turn 0 is compared across the samples, turn 1 (after different turns) is not
    group = [
        _episode([[5, 6], [7]], tool=[9, 9], prompt=[1, 2, 3]),
        _episode([[4], [8, 8]], tool=[9, 9], prompt=[1, 2, 3]),
    ]
    for t, r, tr in zip(group, (1.0, 0.0), ([1.0, 0.0], [0.0, 0.0]), strict=True):
        t.grade = Grade(reward=r, turn_rewards=tr)
    trajs, per_token, _ = advantage_stage([group], AlgorithmConfig(advantage="dr_grpo", turn_level=True, adv_eps=1e-6))
    # turn 0 from the prompt: rewards {1, 0}, d = +-1/2; each sample weighs 1: std^2 = ((1/4)/2 + (1/4)/2) / 1
    z = 0.5 / (0.5 + 1e-6)
    expected_turn = [[0.5 + z, 0.5], [-0.5 - z, -0.5]]
    for t, adv, exp in zip(trajs, per_token, expected_turn, strict=True):
        want = [exp[k] if m else 0.0 for k, m in zip(t.tokens.turn, t.tokens.loss_mask, strict=True)]
        assert adv == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_turn_level_refuses_missing_or_miscounted_turn_rewards():
    with pytest.raises(ValueError, match="no grade.turn_rewards"):
        advantage_stage([_group([1.0, 0.0])], AlgorithmConfig(turn_level=True))
    with pytest.raises(ValueError, match="turn rewards but 2 assistant turns"):
        advantage_stage([_group([1.0, 0.0], turn_rewards=[[1.0], [0.0, 0.0]])], AlgorithmConfig(turn_level=True))


def _crashed(t, flag="python_grader_runtime_error"):
    t.grade = Grade(reward=0.0, errors=[GradeError(flag=flag, grader="judge", message="boom")])
    return t


def test_a_crashing_grader_member_leaves_its_siblings_advantages_exactly_unchanged():
    algo = AlgorithmConfig(advantage="grpo", adv_eps=1e-6)
    healthy = _group([1.0, 0.0, 0.5])
    with_crash = _group([1.0, 0.0, 0.5, 0.0])  # the same three, then one whose judge crashed (reward 0 + flag)
    _crashed(with_crash[3])
    want = advantage_stage(filter_stage(healthy, drop_zero_signal=False).groups, algo)[1]
    kept = filter_stage(with_crash, drop_zero_signal=False)
    trajs, got, _ = advantage_stage(kept.groups, algo)
    assert [t.id for t in trajs] == [t.id for t in with_crash[:3]]
    assert got == want  # the same floats, bit for bit: the crashed member is in no statistic
    assert kept.metrics()["excluded/grader_error"] == 1.0
    assert kept.metrics()["excluded/grader_error/python_grader_runtime_error"] == 1.0
    # had the crash been averaged in as reward 0, the healthy members' advantages would differ
    naive = _group([1.0, 0.0, 0.5, 0.0])
    assert advantage_stage([naive], algo)[1][:3] != want


def test_episode_errors_and_small_groups_are_dropped_and_counted():
    a = _group([1.0, 0.0])
    a[0].status = "error"  # the sampler failed mid-episode: one healthy member left, the group goes
    b = _group([1.0, 0.0, 1.0])
    b[2].grade = None
    for t in b:
        t.group_id = "h"
    c = _group([1.0, 1.0])
    for t in c:
        t.group_id = "flat"
    kept = filter_stage(a + b + c, drop_zero_signal=True)
    assert [[t.id for t in g] for g in kept.groups] == [[t.id for t in b[:2]]]
    m = kept.metrics()
    assert m["excluded/episode_error"] == 1.0 and m["excluded/ungraded"] == 1.0
    assert m["excluded/small_group"] == 1.0 and m["groups_dropped/too_small"] == 1.0
    assert m["groups_dropped/zero_signal"] == 1.0 and m["excluded_trajectories"] == 3.0
    assert m["zero_signal_frac"] == pytest.approx(1 / 3, rel=1e-12)
    with pytest.raises(ValueError, match="filter_stage removes them"):
        advantage_stage([a], AlgorithmConfig())


def test_a_timed_out_episode_is_excluded_and_counted_apart_from_truncation():
    g = _group([1.0, 0.0, 1.0, 0.0])
    g[0].status = "timeout"  # stopped by its wall-time budget: not a measurement of the policy
    g[1].status = "truncated"  # out of tokens: the policy's own doing, trained
    kept = filter_stage(g, drop_zero_signal=False)
    assert [t.id for t in kept.groups[0]] == [t.id for t in g[1:]]
    m = kept.metrics()
    assert m["excluded/timeout"] == 1.0 and m["excluded_trajectories"] == 1.0
