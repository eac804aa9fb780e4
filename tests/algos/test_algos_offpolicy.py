"""Off-policy correction: hand-computed weights, masks and losses (float64), and weights exactly 1 on-policy."""

from __future__ import annotations

import math

import pytest
import torch

from agentrft.algos.offpolicy import behaviour_weights, decoupled_ppo_loss, staleness_histogram

F64 = torch.float64


def _close(got: torch.Tensor, want: list[list[float]]) -> None:
    torch.testing.assert_close(got, torch.tensor(want, dtype=F64), rtol=0, atol=1e-12)


# raw behaviour weights w = exp(prox - behaviour): 3, 0.25, 1, 1.5 ; the last token is padding
PROX = torch.log(torch.tensor([[3.0, 0.25, 1.0, 1.5, 7.0]], dtype=F64))
BEHAV = torch.zeros(1, 5, dtype=F64)
MASK = torch.tensor([[1, 1, 1, 1, 0]])


@pytest.mark.parametrize("correction", ["none", "tis", "mis"])
def test_on_policy_weights_are_exactly_one(correction):
    lp = torch.log(torch.tensor([[0.3, 0.9, 0.01, 0.5]], dtype=F64))
    w, m = behaviour_weights(lp, lp.clone(), torch.ones(1, 4), correction=correction)
    assert torch.equal(w, torch.ones_like(w))
    assert float(m["is/weight_mean"]) == pytest.approx(1.0, abs=1e-15)
    assert float(m["is/weight_max"]) == pytest.approx(1.0, abs=1e-15)
    assert float(m.get("is/masked_frac", 0.0)) == pytest.approx(0.0, abs=1e-15)
    assert float(m.get("is/truncated_frac", 0.0)) == pytest.approx(0.0, abs=1e-15)


def test_truncated_is():
    w, m = behaviour_weights(PROX, BEHAV, MASK, correction="tis", cap=2.0)
    _close(w[:, :4], [[2.0, 0.25, 1.0, 1.5]])
    assert float(m["is/weight_mean"]) == pytest.approx((3 + 0.25 + 1 + 1.5) / 4, abs=1e-12)
    assert float(m["is/weight_max"]) == pytest.approx(3.0, abs=1e-12)  # padding's 7 is not a loss token
    assert float(m["is/truncated_frac"]) == pytest.approx(0.25, abs=1e-12)


def test_masked_is_drops_tokens_outside_the_band():
    w, m = behaviour_weights(PROX, BEHAV, MASK, correction="mis", low=0.5, high=2.0)
    _close(w[:, :4], [[0.0, 0.0, 1.0, 1.5]])
    assert float(m["is/masked_frac"]) == pytest.approx(0.5, abs=1e-12)


def test_decoupled_ppo_hand_computed():
    # current = proximal + [0.5, -0.5, 0, log 1.1]: ratios e^0.5 (clipped high for A > 0), e^-0.5 (clipped low
    # for A < 0), 1, 1.1 (inside)
    delta = torch.tensor([[0.5, -0.5, 0.0, math.log(1.1), 0.0]], dtype=F64)
    logp = (PROX + delta).requires_grad_(True)
    adv = torch.tensor([[1.0, -2.0, 3.0, -1.0, 5.0]], dtype=F64)
    loss, m = decoupled_ppo_loss(logp, PROX, BEHAV, adv, MASK, eps_low=0.2, eps_high=0.28, correction="tis", cap=2.0)
    # -w * min(r A, clip(r) A): token 0: -2 * 1.28 * 1; token 1: -0.25 * (0.8 * -2); token 2: -1 * 3;
    # token 3: -1.5 * (1.1 * -1); padding: 0
    _close(loss, [[-2.56, 0.4, -3.0, 1.65, 0.0]])
    assert float(m["clip_frac"]) == pytest.approx(0.5, abs=1e-12)
    loss.sum().backward()
    # clipped tokens have no gradient; the others: -w * A * r
    _close(logp.grad, [[0.0, 0.0, -3.0, 1.5 * 1.1, 0.0]])


def test_on_policy_decoupled_ppo_is_plain_ppo():
    logp = torch.log(torch.tensor([[0.2, 0.7, 0.4]], dtype=F64)).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 0.5]], dtype=F64)
    loss_a, _ = decoupled_ppo_loss(logp, logp.detach(), logp.detach(), adv, torch.ones(1, 3), correction="tis")
    loss_b, _ = decoupled_ppo_loss(logp, logp.detach(), logp.detach(), adv, torch.ones(1, 3), correction="none")
    assert torch.equal(loss_a, loss_b)
    _close(loss_a, [[-1.0, 1.0, -0.5]])


def test_refusals():
    with pytest.raises(ValueError, match="unknown off-policy correction 'vtrace'"):
        behaviour_weights(PROX, BEHAV, MASK, correction="vtrace")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cap must be > 0"):
        behaviour_weights(PROX, BEHAV, MASK, correction="tis", cap=0.0)
    with pytest.raises(ValueError, match="low <= 1 <= high"):
        behaviour_weights(PROX, BEHAV, MASK, correction="mis", low=1.5, high=2.0)


def test_staleness_histogram():
    h = staleness_histogram([0, 1, 1, 2, 0, 1], max_staleness=2)
    assert h == {
        "staleness/0": 2.0,
        "staleness/1": 3.0,
        "staleness/2": 1.0,
        "staleness/mean": 5 / 6,
        "staleness/max": 2.0,
    }
    assert staleness_histogram([3], max_staleness=1)["staleness/over"] == 1.0
    with pytest.raises(ValueError, match="staleness -1 < 0"):
        staleness_histogram([-1], max_staleness=1)
