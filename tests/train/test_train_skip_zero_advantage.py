"""Zero-advantage trajectories skip the forward and backward (`stages.skip_zero_advantage`) and the update is
the one that computed them: same parameter change, same loss, under every aggregation, with AdamW's moments."""

import random

import pytest
import torch
from conftest import fake_trajectory, tiny_llama

from agentrft.samplers.distribution import Distribution
from agentrft.train.config import OptimizerConfig
from agentrft.train.config.algorithm import AlgorithmConfig
from agentrft.train.core import update as U
from agentrft.train.core.packing import micro_batches, to_sequence
from agentrft.train.rl.stages import skip_zero_advantage


def _trajs(seed: int = 0):
    """Three groups of four: one with advantages, two whose episodes came out alike (advantage 0 everywhere)."""
    rng = random.Random(seed)
    trajs, per_token = [], []
    for g, flat in enumerate([False, True, True]):
        for _ in range(4):
            t = fake_trajectory(rng, turns=rng.randint(1, 3), group=f"g{g}")
            adv = 0.0 if flat else rng.uniform(-1, 1)
            trajs.append(t)
            per_token.append([adv * m for m in t.tokens.loss_mask])
    return trajs, per_token


def _step(trajs, per_token, algo, skipped=(0, 0), steps=1, adam=False):
    model = tiny_llama()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2) if adam else torch.optim.SGD(params, lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    before = [p.detach().clone() for p in params]
    seqs = [to_sequence(i, t, a) for i, (t, a) in enumerate(zip(trajs, per_token, strict=True))]
    metrics = {}
    for _ in range(steps):
        batches = micro_batches(seqs, max_tokens=40, pad_id=0)
        metrics = U.policy_update(
            model,
            opt,
            sched,
            batches,
            algo,
            OptimizerConfig(grad_clip=1e9, logprob_chunk=5),
            dist=Distribution(),
            skipped=skipped,
        )
    return [p.detach() - b for p, b in zip(params, before, strict=True)], metrics


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "constant"])
def test_skipping_zero_advantage_trajectories_changes_nothing_but_the_work(mode):
    algo = AlgorithmConfig(aggregation=mode, constant_max_tokens=16)
    trajs, per_token = _trajs()
    kept, kept_adv, skipped = skip_zero_advantage(trajs, per_token, algo)
    assert len(kept) == 4 and all(t.group_id == "g0" for t in kept)
    flat = trajs[4:]
    assert skipped == (sum(sum(t.tokens.loss_mask) for t in flat), 8)
    d_all, m_all = _step(trajs, per_token, algo)
    d_kept, m_kept = _step(kept, kept_adv, algo, skipped=skipped)
    assert max(float(x.abs().max()) for x in d_all) > 1e-6
    for a, b in zip(d_kept, d_all, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    assert m_kept["loss"] == pytest.approx(m_all["loss"], rel=1e-9, abs=1e-12)
    assert m_kept["train_skipped_sequences"] == 8.0 and m_kept["train_sequences"] == m_all["train_sequences"] == 12.0
    assert m_kept["train_tokens"] == m_all["train_tokens"]
    assert m_kept["train_forward_tokens"] < m_all["train_forward_tokens"]
    # without the skipped counts the denominators shrink: a different (larger) step
    d_wrong, _ = _step(kept, kept_adv, algo)
    assert max(float((a - b).abs().max()) for a, b in zip(d_wrong, d_all, strict=True)) > 1e-8


def test_a_step_with_nothing_left_steps_adamw_as_zero_gradients_would():
    """Every trajectory skipped: the optimizer still steps on zero gradients (its moments decay and carry the
    earlier steps' momentum), as it did when it computed them."""
    algo = AlgorithmConfig()
    trajs, per_token = _trajs()
    # one step with signal, then one where every advantage is 0: computed, and skipped
    model_a, model_b = tiny_llama(), tiny_llama()
    outs = []
    for model, skip in ((model_a, False), (model_b, True)):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        cfg = OptimizerConfig(grad_clip=1e9, logprob_chunk=5)
        seqs = [to_sequence(i, t, a) for i, (t, a) in enumerate(zip(trajs[:4], per_token[:4], strict=True))]
        U.policy_update(model, opt, sched, micro_batches(seqs, 40, 0), algo, cfg, dist=Distribution())
        flat_trajs, flat_adv = trajs[4:], per_token[4:]
        kept, kept_adv, skipped = (
            skip_zero_advantage(flat_trajs, flat_adv, algo) if skip else (flat_trajs, flat_adv, (0, 0))
        )
        assert (kept == []) == skip
        seqs = [to_sequence(i, t, a) for i, (t, a) in enumerate(zip(kept, kept_adv, strict=True))]
        m = U.policy_update(
            model, opt, sched, micro_batches(seqs, 40, 0), algo, cfg, dist=Distribution(), skipped=skipped
        )
        assert "update_skipped" not in m
        outs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_nothing_is_skipped_under_a_kl_term():
    algo = AlgorithmConfig(kl_coef=0.1)
    trajs, per_token = _trajs()
    kept, _, skipped = skip_zero_advantage(trajs, per_token, algo)
    assert kept == trajs and skipped == (0, 0)


def test_a_trajectory_with_any_nonzero_advantage_is_kept():
    rng = random.Random(3)
    t = fake_trajectory(rng, turns=2)
    adv = [0.0] * len(t.tokens.ids)
    last = max(i for i, m in enumerate(t.tokens.loss_mask) if m)
    adv[last] = 0.25  # turn-level credit on one turn only
    kept, _, skipped = skip_zero_advantage([t], [adv], AlgorithmConfig())
    assert kept == [t] and skipped == (0, 0)
