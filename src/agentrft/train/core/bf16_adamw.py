"""AdamW on bf16 weights with bf16 states and stochastic rounding (`optimizer.weights: bf16`).

The update is torchao's (`torchao.optim.adam.single_param_adam`: the moments and the new weight computed in
fp32, the weight rounded stochastically back to bf16), but run eagerly over fixed-size chunks of each tensor
instead of through `torch.compile` as torchao's own `_AdamW.step` does. On a 135M-parameter model the compiled
step held about 240 MiB of the GRPO step's peak RSS (inductor's runtime and kernels) and its first step paid
the compile; in chunks of 2^20 elements the fp32 temporaries stay at a few MiB whatever the largest tensor
(the 28M-element embedding), and the step needs no compiler. torchao is the optional extra `agentrft[lowmem]`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torchao.optim import _AdamW
from torchao.optim.adam import single_param_adam

CHUNK = 1 << 20  # elements per eager update: fp32 temporaries of ~4 MiB each


class ChunkedBf16AdamW(_AdamW):
    """torchao's AdamW (bf16 states, `bf16_stochastic_round=True`), stepped eagerly chunk by chunk.

    Its state dict is `_AdamW`'s (`step`, `exp_avg`, `exp_avg_sq` per parameter), so checkpoints load into
    either. `amsgrad` is refused: nothing here sets it."""

    def __init__(self, params: Any, *, chunk: int = CHUNK, **kwargs: Any) -> None:
        if kwargs.get("amsgrad"):
            raise ValueError("ChunkedBf16AdamW does not implement amsgrad")
        super().__init__(params, bf16_stochastic_round=True, **kwargs)
        self.chunk = chunk

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("ChunkedBf16AdamW: sparse gradients are not supported")
                state = self.state[p]
                if not p.is_contiguous():
                    raise RuntimeError("ChunkedBf16AdamW updates contiguous parameters only")
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                grad = p.grad.contiguous()  # a view when it already is; a read-only copy otherwise
                flat = [t.view(-1) for t in (p.detach(), grad, state["exp_avg"], state["exp_avg_sq"])]
                sr = self.bf16_stochastic_round and p.dtype is torch.bfloat16
                for start in range(0, p.numel(), self.chunk):
                    w, g, m, v = (t[start : start + self.chunk] for t in flat)
                    single_param_adam(
                        w, g, state["step"], m, v, None, group["lr"], beta1, beta2,
                        group["weight_decay"], group["eps"], True, sr,
                    )  # fmt: skip
        return loss
