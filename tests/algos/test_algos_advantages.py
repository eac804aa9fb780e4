import math

import pytest
import torch

from agentrft.algos import advantages as A

S3 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def test_grpo_hand_computed():
    r = _t([1.0, 0.0, 2.0, 0.0, 1.0, 4.0])
    g = torch.tensor([0, 0, 1, 0, 0, 1])
    adv, m = A.grpo(r, g, eps=0.0)
    e = 0.5 / S3
    expected = _t([e, -e, -1 / math.sqrt(2), -e, e, 1 / math.sqrt(2)])
    torch.testing.assert_close(adv, expected, rtol=1e-12, atol=0)
    assert m["adv_abs_max"] == pytest.approx(e, rel=1e-12)


def test_grpo_eps_and_degenerate_groups():
    r = _t([3.0, 3.0, 5.0])
    g = torch.tensor([0, 0, 1])  # group 1 has one sample
    adv, _ = A.grpo(r, g, eps=1e-6)
    assert torch.equal(adv, torch.zeros(3, dtype=torch.float64))
    adv, _ = A.grpo(_t([1.0, 0.0]), torch.tensor([0, 0]), eps=0.5)
    s = math.sqrt(0.5)
    torch.testing.assert_close(adv, _t([0.5 / (s + 0.5), -0.5 / (s + 0.5)]), rtol=1e-12, atol=0)


def test_dr_grpo_mean_only():
    adv, _ = A.dr_grpo(_t([1.0, 0.0, 0.0, 1.0, 2.0, 4.0]), torch.tensor([0, 0, 0, 0, 1, 1]))
    torch.testing.assert_close(adv, _t([0.5, -0.5, -0.5, 0.5, -1.0, 1.0]), rtol=1e-12, atol=0)


def test_rloo_leave_one_out():
    adv, _ = A.rloo(_t([1.0, 0.0, 0.0, 1.0, 2.0, 4.0, 7.0]), torch.tensor([0, 0, 0, 0, 1, 1, 2]))
    torch.testing.assert_close(adv, _t([2 / 3, -2 / 3, -2 / 3, 2 / 3, -2.0, 2.0, 0.0]), rtol=1e-12, atol=0)


def test_order_invariance_and_no_mutation():
    r = _t([0.3, 0.9, 0.1, 0.5, 0.7])
    g = torch.tensor([1, 0, 1, 0, 1])
    r0, g0 = r.clone(), g.clone()
    adv, _ = A.grpo(r, g)
    perm = torch.tensor([4, 2, 0, 3, 1])
    adv_p, _ = A.grpo(r[perm], g[perm])
    torch.testing.assert_close(adv_p, adv[perm], rtol=1e-12, atol=0)
    assert torch.equal(r, r0) and torch.equal(g, g0)


def test_float32_rewards_keep_dtype():
    adv, _ = A.grpo(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert adv.dtype == torch.float32


def test_registry_lists_valid_names():
    assert A.get_advantage_estimator("rloo") is A.rloo
    with pytest.raises(KeyError, match="dr_grpo, grpo, rloo"):
        A.get_advantage_estimator("ppo")


def test_turn_level_formula():
    outcome = _t([0.5, -0.5])
    per_turn, _ = A.turn_level(outcome, [[1.0, 0.0], [0.0]], [2, 1], torch.tensor([0, 0]), eps=0.0)
    # weights 1/2, 1/2 | 1: mean = (1/2)(1/2 + 0) = 1/4; squared deviations (1/2)(9/16 + 1/16) + 1/16 = 3/8,
    # over G - 1 = 1 sample: std = sqrt(3/8)
    std = math.sqrt(3 / 8)
    z1, z0 = 0.75 / std, -0.25 / std
    torch.testing.assert_close(per_turn[0], _t([0.5 + z1, 0.5 + z0]), rtol=1e-12, atol=0)
    torch.testing.assert_close(per_turn[1], _t([-0.5 + z0]), rtol=1e-12, atol=0)
    # weight scales the process part only
    per_turn_w, _ = A.turn_level(outcome, [[1.0, 0.0], [0.0]], [2, 1], torch.tensor([0, 0]), eps=0.0, turn_weight=0.5)
    torch.testing.assert_close(per_turn_w[1], _t([-0.5 + 0.5 * z0]), rtol=1e-12, atol=0)


def test_turn_level_credit_does_not_depend_on_trajectory_length():
    # The docstring's case: both answered right (A = 0); three good calls then the answer, or one.
    per_turn, _ = A.turn_level(
        _t([0.0, 0.0]), [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0]], [4, 2], torch.tensor([0, 0]), eps=0.0
    )
    # mean (1/2)(3/4 + 1/2) = 5/8; deviations (1/4)(3 (3/8)^2 + (5/8)^2) + (1/2)((3/8)^2 + (5/8)^2) = 15/32
    std = math.sqrt(15 / 32)
    good, answer = (3 / 8) / std, (-5 / 8) / std
    torch.testing.assert_close(per_turn[0], _t([good, good, good, answer]), rtol=1e-12, atol=0)
    torch.testing.assert_close(per_turn[1], _t([good, answer]), rtol=1e-12, atol=0)
    # the return-to-go of pooled z (DeepSeekMath) would give the two identical first turns opposite signs
    pooled = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    z = (pooled - pooled.mean()) / pooled.std()
    assert float(z[:4].sum()) == pytest.approx(0.6455, abs=1e-4) and float(z[4:].sum()) == pytest.approx(
        -0.6455, abs=1e-4
    )


def test_turn_level_repeating_a_trajectorys_turns_changes_no_statistic():
    # [1, 0] and [1, 1, 0, 0] are the same sample weighted by turn: same mean and std for the group
    short, _ = A.turn_level(_t([0.0, 0.0]), [[1.0, 0.0], [0.0]], [2, 1], torch.tensor([0, 0]))
    long, _ = A.turn_level(_t([0.0, 0.0]), [[1.0, 1.0, 0.0, 0.0], [0.0]], [4, 1], torch.tensor([0, 0]))
    torch.testing.assert_close(long[0], _t([float(short[0][0])] * 2 + [float(short[0][1])] * 2), rtol=1e-12, atol=0)
    torch.testing.assert_close(long[1], short[1], rtol=1e-12, atol=0)


def test_turn_level_with_one_turn_per_sample_is_grpo_of_the_turn_rewards():
    rewards = [0.3, 1.0, 0.0, 2.0, 5.0]
    group = torch.tensor([0, 0, 0, 1, 1])
    per_turn, _ = A.turn_level(torch.zeros(5, dtype=torch.float64), [[r] for r in rewards], [1] * 5, group, eps=1e-6)
    expected, _ = A.grpo(_t(rewards), group, eps=1e-6)
    torch.testing.assert_close(torch.cat(per_turn), expected, rtol=1e-12, atol=1e-15)


def test_turn_level_equal_turn_rewards_fall_back_to_outcome():
    per_turn, _ = A.turn_level(_t([1.0, -1.0]), [[0.5, 0.5], [0.5]], [2, 1], torch.tensor([0, 0]))
    torch.testing.assert_close(per_turn[0], _t([1.0, 1.0]), rtol=0, atol=1e-12)


def test_turn_reward_never_dropped():
    with pytest.raises(ValueError, match="sample 1 has 1 turn rewards but 2"):
        A.turn_level(_t([0.0, 0.0]), [[1.0], [1.0]], [1, 2], torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="sample 0 has 3 turn rewards but 2"):
        A.turn_level(_t([0.0]), [[1.0, 0.0, 1.0]], [2], torch.tensor([0]))
    # broadcasting refuses a turn that has no sampled token
    with pytest.raises(ValueError, match=r"turns \[1\]"):
        A.broadcast_turn_advantages(_t([1.0, 2.0, 3.0]), torch.tensor([0, 0, 2, 2]), torch.tensor([1, 1, 1, 1]))
    with pytest.raises(ValueError, match="turn 2"):
        A.broadcast_turn_advantages(_t([1.0, 2.0]), torch.tensor([0, 1, 2]), torch.tensor([1, 1, 1]))


def test_broadcast_turn_advantages():
    out = A.broadcast_turn_advantages(
        _t([1.5, -2.0]), torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0, 1, 1, 0, 1, 1])
    )
    torch.testing.assert_close(out, _t([0.0, 1.5, 1.5, 0.0, -2.0, -2.0]), rtol=0, atol=0)
