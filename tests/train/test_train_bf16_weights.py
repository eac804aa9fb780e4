"""``optimizer.weights: bf16`` (train/core/update.make_optimizer): the trained weights, their gradients and
AdamW's states all bf16 (train/core/bf16_adamw.py: stochastic rounding), about half the training memory."""

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


def _bf16_neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 values just below and just above each fp32 value (both equal to it where it is one)."""
    down = x.to(torch.bfloat16)  # nearest, then step to the side x lies on
    up = torch.where(down.float() < x, torch.nextafter(down, torch.full_like(down, float("inf"))), down)
    down = torch.where(down.float() > x, torch.nextafter(down, torch.full_like(down, float("-inf"))), down)
    return down.float(), up.float()


def test_the_step_is_adamw_chunk_by_chunk() -> None:
    """On fp32 parameters (nothing rounded) Bf16AdamW equals torch's AdamW within float tolerance, across chunk
    boundaries (a chunk of 64 elements splits the 37 x 11 tensor)."""
    from agentrft.train.core.bf16_adamw import Bf16AdamW

    gen = torch.Generator().manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in [(37, 11), (5,), (300,)]]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    kw = {"lr": 1e-2, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-8}
    torch_opt, opt = torch.optim.AdamW(ref, foreach=False, **kw), Bf16AdamW(ours, chunk=64, **kw)
    for _ in range(3):
        for a, b in zip(ref, ours, strict=True):
            a.grad = torch.randn(a.shape, generator=gen)
            b.grad = a.grad.clone()
        torch_opt.step()
        opt.step()
    for a, b in zip(ref, ours, strict=True):
        torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-5, atol=1e-6)


def test_bf16_weights_round_to_a_neighbour_unbiased_and_resume_exactly() -> None:
    """A bf16 weight lands on one of the two bf16 neighbours of its fp32 update, on each side as often as makes
    the mean the fp32 value; a checkpointed optimizer resumes the same rounding."""
    from agentrft.train.core.bf16_adamw import Bf16AdamW, round_to_bf16_stochastic

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(20_000, generator=gen)
    down, up = _bf16_neighbours(x)
    rounded = round_to_bf16_stochastic(x, gen).float()
    assert bool(((rounded == down) | (rounded == up)).all())
    one = torch.full((200_000,), 1.0 + 2**-10)  # a quarter of the way from 1 to the next bf16 value (1 + 2^-7)
    mean = float(round_to_bf16_stochastic(one, gen).float().mean())
    assert mean == pytest.approx(1.0 + 2**-10, abs=6e-5)  # 8 standard errors of the mean (7.6e-6 each)
    special = torch.tensor([float("inf"), float("-inf"), 0.0])
    assert torch.equal(round_to_bf16_stochastic(special, gen).float(), special)

    def run(steps: int, resume_at: int | None) -> torch.Tensor:
        w = torch.nn.Parameter(torch.linspace(-1, 1, 5000).to(torch.bfloat16))
        opt = Bf16AdamW([w], lr=1e-4, weight_decay=0.0, chunk=1000)
        grads = torch.Generator().manual_seed(2)
        for step in range(steps):
            if step == resume_at:
                saved = {k: v for k, v in opt.state_dict().items()}
                opt = Bf16AdamW([w], lr=1e-4, weight_decay=0.0, chunk=1000, seed=99)
                opt.load_state_dict(saved)
            w.grad = torch.randn(5000, generator=grads).to(torch.bfloat16)
            opt.step()
        assert opt.state[w]["exp_avg"].dtype == torch.bfloat16
        return w.detach().clone()

    straight = run(4, None)
    assert torch.equal(run(4, 2), straight)
    assert not torch.equal(straight, torch.linspace(-1, 1, 5000).to(torch.bfloat16))  # 1e-4 steps were not lost
