import math

import pytest
import torch

from agentrft.algos import aggregation, dynamic_sampling, losses, shaping


def _lp(ratios):
    return torch.log(torch.tensor([ratios], dtype=torch.float64))


def test_clipping_both_sides_and_gradients():
    old = torch.zeros(1, 5, dtype=torch.float64)
    logp = _lp([1.5, 0.5, 1.5, 0.5, 1.1]).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1]])
    loss, m = losses.clipped_pg_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # 1.5*+1 -> clipped to 1.28 ; 0.5*-1 -> clipped to -0.8 ; 1.5*-1 unclipped ; 0.5*+1 unclipped ; 1.1 inside
    torch.testing.assert_close(
        loss, torch.tensor([[-1.28, 0.8, 1.5, -0.5, -1.1]], dtype=torch.float64), rtol=1e-12, atol=1e-15
    )
    loss.sum().backward()
    # d(-ratio*A)/dlogp = -ratio*A where unclipped, 0 where clipped
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0.0, 0.0, 1.5, -0.5, -1.1]], dtype=torch.float64), rtol=1e-12, atol=1e-15
    )
    assert float(m["clip_frac"]) == pytest.approx(2 / 5, abs=1e-12)
    assert float(m["clip_frac_high"]) == pytest.approx(1 / 5, abs=1e-12)
    assert float(m["clip_frac_low"]) == pytest.approx(1 / 5, abs=1e-12)


def test_asymmetric_bounds_are_separate():
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = _lp([1.25, 0.85])
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, m = losses.clipped_pg_loss(logp, old, adv, torch.ones(1, 2), eps_low=0.1, eps_high=0.3)
    torch.testing.assert_close(loss, torch.tensor([[-1.25, 0.9]], dtype=torch.float64), rtol=1e-12, atol=0)
    assert float(m["clip_frac"]) == pytest.approx(0.5)


def test_mask_zeroes_loss():
    loss, _ = losses.clipped_pg_loss(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1, 0, 1]]))
    torch.testing.assert_close(loss, torch.tensor([[-1.0, 0.0, -1.0]]), rtol=0, atol=0)


def test_k3_kl_hand_computed_and_only_when_coef_positive():
    logp = torch.log(torch.tensor([[0.5, 0.3]], dtype=torch.float64))
    ref = torch.log(torch.tensor([[0.25, 0.3]], dtype=torch.float64))
    kl = losses.k3_kl(logp, ref)
    torch.testing.assert_close(
        kl, torch.tensor([[0.5 + math.log(0.5) * -1 - 1, 0.0]], dtype=torch.float64), rtol=1e-12, atol=1e-15
    )
    adv = torch.zeros(1, 2, dtype=torch.float64)
    loss, m = losses.clipped_pg_loss(logp, logp.detach(), adv, torch.ones(1, 2), ref_logprobs=ref, kl_coef=0.1)
    torch.testing.assert_close(loss, 0.1 * kl, rtol=1e-12, atol=0)
    assert float(m["kl"]) == pytest.approx(float(kl.mean()), rel=1e-12)
    # kl_coef 0: no reference needed, no KL metric
    _, m0 = losses.clipped_pg_loss(logp, logp, adv, torch.ones(1, 2), kl_coef=0.0)
    assert "kl" not in m0
    with pytest.raises(ValueError, match="ref_logprobs"):
        losses.clipped_pg_loss(logp, logp, adv, torch.ones(1, 2), kl_coef=0.1)


def test_truncated_importance_weights():
    old = torch.log(torch.tensor([[3.0, 0.5, 1.0]], dtype=torch.float64))
    sampler = torch.zeros(1, 3, dtype=torch.float64)
    logp = old.clone().requires_grad_(True)
    loss, m = losses.clipped_pg_loss(
        logp, old, torch.ones(1, 3, dtype=torch.float64), torch.ones(1, 3), sampler_logprobs=sampler, correction="tis"
    )
    torch.testing.assert_close(loss, torch.tensor([[-2.0, -0.5, -1.0]], dtype=torch.float64), rtol=1e-12, atol=0)
    assert float(m["is/weight_mean"]) == pytest.approx(4.5 / 3, rel=1e-12)  # the raw weights 3, 0.5, 1
    assert float(m["is/weight_max"]) == pytest.approx(3.0, rel=1e-12)
    loss.sum().backward()  # weights are detached: gradient is w * d(ratio)/dlogp = w * 1
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, -0.5, -1.0]], dtype=torch.float64), rtol=1e-12, atol=0)
    # no sampler log-probs, or correction none: no weights and no is/ metrics
    _, m = losses.clipped_pg_loss(logp, old, torch.ones(1, 3, dtype=torch.float64), torch.ones(1, 3))
    assert not any(k.startswith("is/") for k in m)


def test_entropy_is_metric_only():
    ent = torch.tensor([[1.0, 3.0, 100.0]])
    loss_a, m = losses.clipped_pg_loss(
        torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1, 1, 0]]), entropy=ent
    )
    loss_b, _ = losses.clipped_pg_loss(
        torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1, 1, 0]])
    )
    assert torch.equal(loss_a, loss_b)
    assert float(m["entropy"]) == pytest.approx(2.0)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_aggregation_modes():
    assert float(aggregation.token_mean(LOSS, MASK, global_num_tokens=4)) == pytest.approx(10 / 4, rel=1e-12)
    assert float(aggregation.seq_mean_token_mean(LOSS, MASK, global_num_sequences=2)) == pytest.approx(
        (2 + 4) / 2, rel=1e-12
    )
    assert float(aggregation.constant(LOSS, MASK, normaliser=6)) == pytest.approx(10 / 6, rel=1e-12)
    kw = dict(global_num_tokens=8, global_num_sequences=4, max_tokens=5)
    assert float(aggregation.aggregate("token_mean", LOSS, MASK, **kw)) == pytest.approx(10 / 8, rel=1e-12)
    assert float(aggregation.aggregate("seq_mean_token_mean", LOSS, MASK, **kw)) == pytest.approx(6 / 4, rel=1e-12)
    assert float(aggregation.aggregate("constant", LOSS, MASK, **kw)) == pytest.approx(10 / 20, rel=1e-12)
    with pytest.raises(ValueError, match="valid"):
        aggregation.aggregate("sum", LOSS, MASK, **kw)  # type: ignore[arg-type]


def test_aggregation_split_over_microbatches_sums_to_whole():
    for mode in ("token_mean", "seq_mean_token_mean", "constant"):
        kw = dict(global_num_tokens=4, global_num_sequences=2, max_tokens=3)
        whole = aggregation.aggregate(mode, LOSS, MASK, **kw)
        parts = aggregation.aggregate(mode, LOSS[:1], MASK[:1], **kw) + aggregation.aggregate(
            mode, LOSS[1:], MASK[1:], **kw
        )
        torch.testing.assert_close(parts, whole, rtol=1e-12, atol=0)


def test_overlong_shaping():
    pen = shaping.overlong_penalty(torch.tensor([3, 6, 7, 8, 10, 11]), max_len=10, cache_len=4)
    torch.testing.assert_close(
        pen, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0], dtype=torch.float64), rtol=1e-12, atol=0
    )
    shaped, m = shaping.shape_rewards(
        torch.tensor([1.0, 1.0]), torch.tensor([8, 2]), max_len=10, cache_len=4, penalty=0.5
    )
    torch.testing.assert_close(shaped, torch.tensor([0.75, 1.0]), rtol=1e-6, atol=0)
    assert m["overlong_frac"] == 0.5
    with pytest.raises(ValueError):
        shaping.overlong_penalty(torch.tensor([1]), max_len=4, cache_len=5)


def test_dynamic_sampling_filter():
    keep, stats = dynamic_sampling.filter_groups([[1, 1, 1], [0, 1, 0], [0.0, 0.0], [0.5]])
    assert keep == [1]
    assert stats == {"groups_total": 4.0, "groups_kept": 1.0, "zero_signal_frac": 0.75}
