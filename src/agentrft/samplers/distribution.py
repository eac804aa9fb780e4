"""The sampling distribution: one definition shared by the samplers and the trainer.

A sampler that draws with temperature T, top-k K and top-p P draws from
``softmax(warp(logits))`` where ``warp`` divides the logits by T, then keeps the K
largest, then the smallest set of the rest whose probability reaches P (HF's
warper order), setting everything else to ``-inf``. It reports
``log_softmax(warp(logits))[token]``: the log-prob of the distribution it sampled
from. The trainer recomputes exactly that quantity for the current weights with
the same `Distribution` (built from the rollout config, never set separately), so
importance ratios between the two compare like with like.

Greedy decoding (temperature 0) is a point mass; samplers report the raw
(temperature-1) log-prob of the chosen token there, as a diagnostic. Greedy
trajectories cannot be trained on (the rollout temperature must be > 0).

Shape legend: N rows, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentrft.samplers.base import SamplingParams


@dataclass(frozen=True)
class Distribution:
    """Temperature, top-k and top-p of a sampling distribution (temperature > 0)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"a sampling distribution needs temperature > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")

    @classmethod
    def of(cls, params: SamplingParams) -> Distribution:
        return cls(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)

    @property
    def truncates(self) -> bool:
        """Whether some tokens get probability 0 (top-k or top-p in force)."""
        return self.top_p < 1.0 or self.top_k is not None

    def warp(self, logits: Tensor, keep: Tensor | None = None) -> Tensor:
        """[N, V] logits of this distribution: ``logits / T`` with dropped tokens at ``-inf``.

        ``keep`` ([N] token ids) is never dropped: a trainer recomputing the log-prob of a sampled
        token must not find it outside a truncation whose boundary moved by float rounding.
        The truncation mask carries no gradient; the kept logits do.
        """
        x = logits / self.temperature if self.temperature != 1.0 else logits
        if not self.truncates:
            return x
        with torch.no_grad():
            drop = torch.zeros_like(x, dtype=torch.bool)
            if self.top_k is not None and self.top_k < x.shape[-1]:
                kth = torch.topk(x, self.top_k, dim=-1).values[..., -1:]
                drop |= x < kth
            if self.top_p < 1.0:
                drop |= top_p_drop(x.masked_fill(drop, float("-inf")), self.top_p)
            if keep is not None:
                drop.scatter_(-1, keep.unsqueeze(-1), False)
        return x.masked_fill(drop, float("-inf"))


def top_p_drop(x: Tensor, top_p: Tensor | float) -> Tensor:
    """[N, V] bool: tokens outside the nucleus of ``softmax(x)`` (the smallest set of the most likely
    tokens whose mass reaches ``top_p``, per row; at least one token is always kept)."""
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    probs = torch.softmax(sorted_x, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
    p = top_p[:, None] if isinstance(top_p, Tensor) else top_p
    drop_sorted = mass_before >= p
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def entropy(logp: Tensor) -> Tensor:
    """Entropy of each row of ``logp`` ([N, V] log-probs, ``-inf`` allowed for dropped tokens)."""
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(logp)).sum(-1)
