"""The Bradley–Terry loss on hand-computed pairs: values, gradients, centring, accuracy with ties."""

import math

import pytest
import torch

from agentrft.algos.reward_model import bradley_terry_loss, pairwise_accuracy


def _t(xs):
    return torch.tensor(xs, dtype=torch.float64, requires_grad=True)


def test_loss_and_gradients_hand_computed():
    chosen, rejected = _t([2.0, 0.0, -1.0]), _t([1.0, 0.0, 0.5])
    losses, m = bradley_terry_loss(chosen, rejected)
    # diff = [1, 0, -1.5]; -log sigma(d) = log(1 + exp(-d))
    expected = [math.log(1 + math.exp(-1.0)), math.log(2.0), math.log(1 + math.exp(1.5))]
    torch.testing.assert_close(losses, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    losses.sum().backward()
    # d/dr_w = -(1 - sigma(d)) = -sigma(-d); d/dr_l = +sigma(-d)
    sig = [1 / (1 + math.exp(d)) for d in (1.0, 0.0, -1.5)]
    torch.testing.assert_close(chosen.grad, torch.tensor([-s for s in sig], dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(rejected.grad, torch.tensor(sig, dtype=torch.float64), rtol=1e-12, atol=0)
    assert m["rm/accuracy"].tolist() == [1.0, 0.5, 0.0]  # a tie counts half
    assert m["rm/margin"].tolist() == [1.0, 0.0, -1.5]
    assert m["rm/chosen_score"].tolist() == [2.0, 0.0, -1.0] and not m["rm/margin"].requires_grad


def test_equal_scores_give_log_2_and_a_shift_changes_nothing_without_centring():
    chosen, rejected = _t([0.3, -7.0]), _t([0.3, -7.0])
    losses, _ = bradley_terry_loss(chosen, rejected)
    torch.testing.assert_close(losses, torch.full((2,), math.log(2.0), dtype=torch.float64), rtol=1e-14, atol=0)
    a, _ = bradley_terry_loss(_t([1.0]), _t([-0.5]))
    b, _ = bradley_terry_loss(_t([101.0]), _t([99.5]))
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def test_centring_term_hand_computed():
    chosen, rejected = _t([2.0]), _t([1.0])
    losses, _ = bradley_terry_loss(chosen, rejected, center_coef=0.1)
    # log(1 + e^-1) + 0.1 * (2 + 1)^2
    assert float(losses[0].detach()) == pytest.approx(math.log(1 + math.exp(-1.0)) + 0.9, abs=1e-12)
    losses.sum().backward()
    s = 1 / (1 + math.exp(1.0))
    assert float(chosen.grad[0]) == pytest.approx(-s + 0.1 * 2 * 3, abs=1e-12)
    assert float(rejected.grad[0]) == pytest.approx(s + 0.1 * 2 * 3, abs=1e-12)


def test_refuses_mismatched_shapes_and_negative_centring():
    with pytest.raises(ValueError, match="both be"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="center_coef"):
        bradley_terry_loss(torch.zeros(2), torch.zeros(2), center_coef=-1.0)


def test_pairwise_accuracy():
    acc = pairwise_accuracy(torch.tensor([1.0, 0.0, 2.0, 3.0]), torch.tensor([0.0, 1.0, 2.0, -3.0]))
    assert acc.tolist() == [1.0, 0.0, 0.5, 1.0]
