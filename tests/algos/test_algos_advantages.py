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
    """Three samples of one group: A and B act from the same state at turns 0 and 1, C only at turn 0."""
    outcome = _t([0.5, -0.5, 0.0])
    rewards = [[1.0, 0.0], [0.5, 1.0], [1.0, 1.0, 0.0]]
    states = [["s0", "a1"], ["s0", "a1"], ["s0", "c1", "c2"]]
    per_turn, _ = A.turn_level(outcome, rewards, [2, 2, 3], torch.tensor([0, 0, 0]), states=states, eps=0.0)
    # S(s0) = {1, 0.5, 1}: mean 5/6; S(a1) = {0, 1}: mean 1/2; c1 and c2 have no sibling: d = 0
    d = [[1 / 6, -1 / 2], [-1 / 3, 1 / 2], [1 / 6, 0.0, 0.0]]
    var = ((1 / 36 + 1 / 4) / 2 + (1 / 9 + 1 / 4) / 2 + (1 / 36) / 3) / (3 - 1)  # each sample weighs 1
    std = math.sqrt(var)
    for got, o, di in zip(per_turn, [0.5, -0.5, 0.0], d, strict=True):
        torch.testing.assert_close(got, _t([o + x / std for x in di]), rtol=1e-12, atol=1e-15)
    # the weight scales the process part only
    per_turn_w, _ = A.turn_level(
        outcome, rewards, [2, 2, 3], torch.tensor([0, 0, 0]), states=states, eps=0.0, turn_weight=0.5
    )
    torch.testing.assert_close(per_turn_w[1], _t([-0.5 + 0.5 * x / std for x in d[1]]), rtol=1e-12, atol=1e-15)


def test_turn_level_gives_a_group_of_identical_episodes_nothing():
    """Four identical, correct episodes whose milestones pay the calls and not the answer: pooling every turn
    of the group pushed the answer down (z = -1.5) and the calls up; from the same states they agree: 0."""
    rewards = [[1.0, 1.0, 1.0, 0.0]] * 4
    states = [["p", "p+s", "p+s+o", "p+s+o+c"]] * 4
    per_turn, _ = A.turn_level(_t([0.0] * 4), rewards, [4] * 4, torch.tensor([0] * 4), states=states)
    assert all(int(torch.count_nonzero(x)) == 0 for x in per_turn)


def test_turn_level_compares_a_turn_only_with_turns_from_its_state():
    # two samples diverge at turn 1 (different tool results before it): their turn-1 rewards are not compared,
    # however different; their turn-0 rewards, from the one prompt, are
    per_turn, _ = A.turn_level(
        _t([0.0, 0.0]),
        [[1.0, 1.0], [1.0, -1.0]],
        [2, 2],
        torch.tensor([0, 0]),
        states=[["p", "x"], ["p", "y"]],
    )
    assert all(int(torch.count_nonzero(x)) == 0 for x in per_turn)
    # by turn index (no states) they are compared
    by_index, _ = A.turn_level(_t([0.0, 0.0]), [[1.0, 1.0], [1.0, -1.0]], [2, 2], torch.tensor([0, 0]))
    assert float(by_index[0][1]) > 0 > float(by_index[1][1]) and float(by_index[0][0]) == 0.0
    with pytest.raises(ValueError, match="one state per turn reward"):
        A.turn_level(_t([0.0]), [[1.0, 0.0]], [2], torch.tensor([0]), states=[["p"]])


def test_flat_groups_get_exactly_zero_outcome_advantage():
    # 8 x 0.1 does not sum to 0.8 exactly; the advantages of an all-equal group are still exactly 0
    rewards = _t([0.1] * 8 + [1.2] * 3 + [0.13333333333333333] * 5)
    group = torch.tensor([0] * 8 + [1] * 3 + [2] * 5)
    for fn in (A.grpo, A.dr_grpo, A.rloo):
        adv, _ = fn(rewards, group)
        assert int(torch.count_nonzero(adv)) == 0


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
