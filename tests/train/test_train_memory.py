"""Memory helpers and the optimizer the trainer builds."""

from __future__ import annotations

import sys

import pytest
import torch

from agentrft.memory import peak_rss_mib, trim
from agentrft.train.config import OptimizerConfig
from agentrft.train.core.update import make_optimizer


def test_peak_rss_is_measured() -> None:
    before = peak_rss_mib()
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    assert peak_rss_mib() >= before
    assert peak_rss_mib() > 64
    del block


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_trim_returns_true_on_glibc() -> None:
    assert trim() is True


def test_make_optimizer_is_fused_adamw_and_steps_like_the_default() -> None:
    torch.manual_seed(0)
    a = torch.nn.Linear(16, 8)
    b = torch.nn.Linear(16, 8)
    b.load_state_dict(a.state_dict())
    cfg = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    fused = make_optimizer(list(a.parameters()), cfg)
    plain = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    assert isinstance(fused, torch.optim.AdamW) and fused.defaults["fused"] is True
    x = torch.randn(4, 16)
    for _ in range(3):
        for model, opt in ((a, fused), (b, plain)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
