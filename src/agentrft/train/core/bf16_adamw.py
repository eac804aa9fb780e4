"""AdamW on bf16 weights with bf16 moments and stochastic rounding (`optimizer.weights: bf16`).

Without an fp32 master copy, a bf16 weight rounded to nearest loses every update smaller than half its spacing
(2^-8 of its magnitude), which at a learning rate of 1e-5 is nearly all of them. Stochastic rounding keeps
them in expectation: the fp32 result is rounded up or down to a neighbouring bf16 value with probabilities
that make the rounded value unbiased. The moments are stored in bf16 too and computed in fp32.

The step runs over fixed-size chunks of each tensor, so the fp32 temporaries are a few MiB whatever the largest
tensor (a 135M model's 28M-element embedding), and it needs no compiler. Per element, with g the gradient,
m and v the moments, t the step count (Loshchilov & Hutter's AdamW):

    w <- w (1 - lr wd)
    m <- b1 m + (1 - b1) g,    v <- b2 v + (1 - b2) g^2
    w <- w - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

Written here rather than taken from torchao (whose `_AdamW(bf16_stochastic_round=True)` does the same through
`torch.compile`): the update is a few lines, and torchao was a pinned extra whose import (transformers imports
it in every process that loads a model once it is installed) added 83 MiB over torch and transformers alone and
printed torch.compile warnings; its compiled step also paid a compile on the first update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

CHUNK = 1 << 20  # elements per step of the loop: fp32 temporaries of ~4 MiB each


def round_to_bf16_stochastic(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``x`` (fp32) rounded to bf16, up or down at random so that the expected value is ``x``.

    bf16 is fp32's upper 16 bits: adding a uniform random 16-bit integer to the bit pattern and truncating
    the lower half carries into the upper half with probability (lower half) / 2^16, which is the distance
    to the lower neighbour over the spacing. Infinities and NaNs are passed through unchanged."""
    bits = x.view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    rounded = ((bits + noise) & -65536).view(torch.float32)  # -65536 == 0xFFFF0000 as int32
    return torch.where(torch.isfinite(x), rounded, x).to(torch.bfloat16)


class Bf16AdamW(torch.optim.Optimizer):
    """AdamW for bf16 parameters: bf16 moments, fp32 arithmetic, stochastically rounded weights.

    Parameters of another dtype are updated in their own dtype without rounding (an fp32 parameter gets
    plain AdamW). State per parameter: ``step`` (a float tensor), ``exp_avg``, ``exp_avg_sq``."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        chunk: int = CHUNK,
        seed: int = 0,
    ) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or chunk < 1:
            raise ValueError(f"invalid AdamW settings: lr={lr}, betas={betas}, eps={eps}, chunk={chunk}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.chunk = chunk
        self.generator = torch.Generator().manual_seed(seed)  # the rounding's own stream: reproducible runs

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rounding_rng": self.generator.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        rng = state_dict.pop("rounding_rng", None)
        super().load_state_dict(state_dict)
        if rng is not None:  # a checkpoint resumes the rounding where it stopped
            self.generator.set_state(rng)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, p.grad, group)
        return loss

    def _update(self, p: torch.nn.Parameter, grad: torch.Tensor, group: dict[str, Any]) -> None:
        if grad.is_sparse or not p.is_contiguous():
            raise RuntimeError("Bf16AdamW updates contiguous parameters with dense gradients")
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        state["step"] += 1
        t = float(state["step"])
        lr, (b1, b2), eps, wd = float(group["lr"]), group["betas"], group["eps"], group["weight_decay"]
        c1, c2 = 1 - b1**t, 1 - b2**t
        flat = [x.view(-1) for x in (p.detach(), grad.contiguous(), state["exp_avg"], state["exp_avg_sq"])]
        for start in range(0, p.numel(), self.chunk):
            w, g, m, v = (x[start : start + self.chunk] for x in flat)
            g32 = g.float()
            m32 = m.float().lerp_(g32, 1 - b1)
            v32 = v.float().lerp_(g32.square(), 1 - b2)
            m.copy_(m32)
            v.copy_(v32)
            w32 = w.float().mul_(1 - lr * wd)
            w32.addcdiv_(m32, (v32 / c2).sqrt_().add_(eps), value=-lr / c1)
            w.copy_(round_to_bf16_stochastic(w32, self.generator) if w.dtype == torch.bfloat16 else w32)
