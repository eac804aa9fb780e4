"""Preference losses (DPO, IPO, length-normalised DPO) on a hand-computed 2-pair batch, in float64."""

from __future__ import annotations

import math

import pytest
import torch

from agentrft.algos import PREFERENCE_LOSSES, preference_loss

# Two pairs, beta = 0.2. Sums of log-probs over loss tokens, and the loss-token counts:
#   pair 1: policy chosen -3, rejected -5; reference chosen -3.5, rejected -4; 3 and 4 tokens
#   pair 2: policy chosen -10, rejected -2; reference chosen -9, rejected -2.5; 5 and 2 tokens
# log-ratio differences h = (pc - rc) - (pr - rr):  pair 1: 0.5 - (-1) = 1.5;  pair 2: -1 - 0.5 = -1.5
# length-normalised:  pair 1: 0.5/3 + 1/4 = 5/12;  pair 2: -1/5 - 0.5/2 = -0.45
BETA = 0.2


def _batch():
    t = lambda *x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    pc = t(-3.0, -10.0).requires_grad_(True)
    pr = t(-5.0, -2.0).requires_grad_(True)
    return pc, pr, t(-3.5, -9.0), t(-4.0, -2.5), t(3.0, 5.0), t(4.0, 2.0)


def _loss(name):
    pc, pr, rc, rr, nc, nr = _batch()
    losses, m = preference_loss(name, pc, pr, rc, rr, beta=BETA, chosen_tokens=nc, rejected_tokens=nr)
    return losses, m, pc, pr


def _close(got, want):
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(want, abs=1e-9, rel=0)


def test_dpo_sigmoid_hand_computed():
    losses, m, pc, pr = _loss("sigmoid")
    # -log sigmoid(beta h) = log(1 + exp(-beta h)), beta h = +-0.3
    _close(losses, [math.log1p(math.exp(-0.3)), math.log1p(math.exp(0.3))])
    _close(m["rewards/chosen"], [0.1, -0.2])  # beta (pc - rc)
    _close(m["rewards/rejected"], [-0.2, 0.1])
    _close(m["rewards/margin"], [0.3, -0.3])
    _close(m["rewards/accuracy"], [1.0, 0.0])
    losses.sum().backward()
    # d/d pc of log(1 + exp(-beta h)) = -beta sigmoid(-beta h); d/d pr is its negative
    g1, g2 = -BETA / (1 + math.exp(0.3)), -BETA / (1 + math.exp(-0.3))
    _close(pc.grad, [g1, g2])
    _close(pr.grad, [-g1, -g2])


def test_ipo_hand_computed():
    losses, m, pc, pr = _loss("ipo")
    # (h - 1/(2 beta))^2 with 1/(2 beta) = 2.5: (1.5 - 2.5)^2 = 1, (-1.5 - 2.5)^2 = 16
    _close(losses, [1.0, 16.0])
    _close(m["rewards/margin"], [0.3, -0.3])
    losses.sum().backward()
    _close(pc.grad, [2 * (1.5 - 2.5), 2 * (-1.5 - 2.5)])  # d/dh, and dh/d pc = 1
    _close(pr.grad, [-2 * (1.5 - 2.5), -2 * (-1.5 - 2.5)])


def test_length_normalised_dpo_hand_computed():
    losses, m, pc, pr = _loss("sigmoid_norm")
    # beta h: 0.2 * 5/12 = 1/12; 0.2 * -0.45 = -0.09
    _close(losses, [math.log1p(math.exp(-1 / 12)), math.log1p(math.exp(0.09))])
    _close(m["rewards/chosen"], [0.2 * 0.5 / 3, 0.2 * -1 / 5])
    _close(m["rewards/rejected"], [0.2 * -1 / 4, 0.2 * 0.5 / 2])
    _close(m["rewards/accuracy"], [1.0, 0.0])
    losses.sum().backward()
    g1, g2 = -BETA / (1 + math.exp(1 / 12)), -BETA / (1 + math.exp(-0.09))
    _close(pc.grad, [g1 / 3, g2 / 5])  # each log-prob divided by its token count
    _close(pr.grad, [-g1 / 4, -g2 / 2])


@pytest.mark.parametrize("name", sorted(PREFERENCE_LOSSES))
def test_at_initialisation_policy_equals_reference(name):
    lp = torch.tensor([-3.0, -10.0, -0.5], dtype=torch.float64)
    n = torch.tensor([3.0, 5.0, 1.0], dtype=torch.float64)
    losses, m = preference_loss(name, lp, lp.flip(0), lp, lp.flip(0), beta=BETA, chosen_tokens=n, rejected_tokens=n)
    want = 1 / (4 * BETA**2) if name == "ipo" else math.log(2)
    _close(losses, [want] * 3)
    _close(m["rewards/margin"], [0.0] * 3)


def test_refusals_name_the_problem():
    pc, pr, rc, rr, nc, nr = _batch()
    with pytest.raises(ValueError, match="unknown preference loss 'hinge'; valid: sigmoid, ipo, sigmoid_norm"):
        preference_loss("hinge", pc, pr, rc, rr, beta=BETA, chosen_tokens=nc, rejected_tokens=nr)
    with pytest.raises(ValueError, match="beta must be > 0"):
        preference_loss("sigmoid", pc, pr, rc, rr, beta=0.0, chosen_tokens=nc, rejected_tokens=nr)
    with pytest.raises(ValueError, match="at least one loss token"):
        preference_loss("sigmoid_norm", pc, pr, rc, rr, beta=BETA, chosen_tokens=nc * 0, rejected_tokens=nr)
