"""``optimizer.weights: bf16`` (train/core/update.make_optimizer): the trained weights, their gradients and
AdamW's states all bf16 (torchao's AdamW with stochastic rounding), about half the training memory."""

from __future__ import annotations

import fakes_train as F
import pytest
import torch

from agentrft.train import train
from agentrft.train.config import ConfigError

BF16 = {"optimizer.weights": "bf16", "policy.precision": "bf16", "policy.sampler_precision": "bf16"}


def test_weights_gradients_and_states_stay_bf16_and_the_weights_move(tmp_path) -> None:

    comps = F.components(tmp_path)
    before = {n: p.detach().to(torch.bfloat16).clone() for n, p in comps.sampler.model.named_parameters()}
    cfg = F.config(**{**BF16, "steps": 2, "eval.every_steps": 0, "checkpoint.every_steps": 1})
    result = train(cfg, tmp_path, components=comps)
    model = comps.sampler.model  # the sampler shares the trained weights: it samples the bf16 policy
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(moved) > len(before) // 2, moved
    assert all(abs(h["loss"]) < 1e3 for h in result.history) and result.steps == 2
    states = torch.load(tmp_path / "checkpoints" / "step-00000002" / "trainer.pt", weights_only=False)
    moments = [t for s in states["optimizer"]["state"].values() for k, t in s.items() if k.startswith("exp_avg")]
    assert moments and {t.dtype for t in moments} == {torch.bfloat16}


@pytest.mark.parametrize(
    "sets,why",
    [
        ({"policy.finetune": "lora"}, "for policy.finetune full"),
        ({"policy.precision": "fp32"}, "compute in bf16"),
        ({"policy.sampler_precision": "fp32"}, "compute in bf16"),
    ],
)
def test_bf16_weights_are_refused_where_they_cannot_train(sets, why) -> None:
    with pytest.raises((ConfigError, ValueError), match=why):
        F.config(**{**BF16, **sets})


def test_the_chunked_step_is_torchaos_update() -> None:
    """The eager chunked step (train/core/bf16_adamw.py) gives torchao's AdamW update: on fp32 weights (no
    rounding) equal to torch's AdamW within float tolerance, chunk boundaries included; on bf16 weights each
    element lands on one of the two bf16 neighbours of the fp32 update (stochastic rounding)."""
    from agentrft.train.core.bf16_adamw import ChunkedBf16AdamW

    gen = torch.Generator().manual_seed(0)
    shapes = [(37, 11), (5,), (300,)]
    ref = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    kw = {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8}
    torch_opt = torch.optim.AdamW(ref, foreach=False, **kw)
    chunked = ChunkedBf16AdamW(ours, chunk=64, **kw)  # 64 < 37 * 11: several chunks per tensor
    for _ in range(3):
        for a, b in zip(ref, ours, strict=True):
            g = torch.randn(a.shape, generator=gen)
            a.grad, b.grad = g.clone(), g.clone()
        torch_opt.step()
        chunked.step()
    for a, b in zip(ref, ours, strict=True):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-5, atol=1e-6)

    w = torch.nn.Parameter(torch.randn(4096, generator=gen).to(torch.bfloat16))
    start = w.detach().float().clone()
    opt = ChunkedBf16AdamW([w], chunk=1000, **{**kw, "weight_decay": 0.0})
    w.grad = torch.randn(4096, generator=gen).to(torch.bfloat16)
    opt.step()
    exact = start - 1e-2 * torch.sign(w.grad.float())  # Adam's first step: lr * g / |g|
    lo = exact.to(torch.bfloat16).float()
    up = torch.nextafter(lo.to(torch.bfloat16), torch.full_like(lo, float("inf")).to(torch.bfloat16)).float()
    down = torch.nextafter(lo.to(torch.bfloat16), torch.full_like(lo, float("-inf")).to(torch.bfloat16)).float()
    got = w.detach().float()
    assert bool(((got == lo) | (got == up) | (got == down)).all())
    assert opt.state[w]["exp_avg"].dtype == torch.bfloat16
