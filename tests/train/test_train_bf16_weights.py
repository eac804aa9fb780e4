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
