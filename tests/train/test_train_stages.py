import math
import random

import pytest

from agentrft.train.config import AlgorithmConfig
from agentrft.train.stages import advantage_stage, group_trajectories, next_tasks
from agentrft.types import Grade, Message, Task

from conftest import fake_trajectory


def test_next_tasks_is_a_deterministic_endless_shuffle():
    tasks = [Task(id=str(i), messages=[Message(role="user", content="q")]) for i in range(5)]
    first = [t.id for t in next_tasks(tasks, 0, 5, seed=1)]
    assert sorted(first) == ["0", "1", "2", "3", "4"]  # one epoch = every task once
    assert [t.id for t in next_tasks(tasks, 2, 5, seed=1)][:3] == first[2:]  # a cursor resumes the stream
    assert [t.id for t in next_tasks(tasks, 0, 5, seed=1)] == first
    with pytest.raises(ValueError, match="no training tasks"):
        next_tasks([], 0, 1, seed=0)


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
        assert adv == [sign * a * m for m in t.tokens.loss_mask]


def test_turn_level_through_the_stage():
    group = _group([1.0, 0.0], turn_rewards=[[1.0, 0.0], [0.0, 0.0]])
    trajs, per_token, _ = advantage_stage([group], AlgorithmConfig(advantage="dr_grpo", turn_level=True, adv_eps=1e-6))
    # pooled turn rewards [1,0,0,0]: mean 1/4, unbiased std 1/2
    z1, z0 = 0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)
    expected_turn = [[0.5 + z1 + z0, 0.5 + z0], [-0.5 + 2 * z0, -0.5 + z0]]
    for t, adv, exp in zip(trajs, per_token, expected_turn, strict=True):
        want = [exp[k] if m else 0.0 for k, m in zip(t.tokens.turn, t.tokens.loss_mask, strict=True)]
        assert adv == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_turn_level_refuses_missing_or_miscounted_turn_rewards():
    with pytest.raises(ValueError, match="no grade.turn_rewards"):
        advantage_stage([_group([1.0, 0.0])], AlgorithmConfig(turn_level=True))
    with pytest.raises(ValueError, match="turn rewards but 2 assistant turns"):
        advantage_stage([_group([1.0, 0.0], turn_rewards=[[1.0], [0.0, 0.0]])], AlgorithmConfig(turn_level=True))
