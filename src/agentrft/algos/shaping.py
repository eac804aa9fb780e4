"""DAPO overlong reward shaping (arXiv 2503.14476 §3.4, "soft overlong punishment").

For a response of length ``L`` (sampled tokens), budget ``L_max`` and cache ``L_cache``:

    R_len = 0                                   if L <= L_max - L_cache
          = ((L_max - L_cache) - L) / L_cache   if L_max - L_cache < L <= L_max
          = -1                                  if L > L_max

scaled by ``penalty`` and *added* to the task reward. Departure: for an agent
episode ``L`` is the number of tokens the policy sampled over all turns (tool
results and prompts are not the policy's length), and ``penalty`` is
configurable (DAPO uses 1).

Shape legend: N = samples; lengths (N,).
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(lengths: Tensor, *, max_len: int, cache_len: int, penalty: float = 1.0) -> Tensor:
    """The (non-positive) length reward R_len of each sample, float64 (N,)."""
    if cache_len < 0 or cache_len > max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = lengths.to(torch.float64)
    start = max_len - cache_len
    if cache_len == 0:
        ramp = torch.zeros_like(lengths)
    else:
        ramp = (start - lengths) / cache_len
    r = torch.where(lengths <= start, torch.zeros_like(lengths), ramp)
    r = torch.where(lengths > max_len, torch.full_like(lengths, -1.0), r)
    return penalty * r


def shape_rewards(
    rewards: Tensor, lengths: Tensor, *, max_len: int, cache_len: int, penalty: float = 1.0
) -> tuple[Tensor, dict[str, float]]:
    """``rewards + overlong_penalty(lengths)`` (a new tensor) and the fraction of penalised samples."""
    pen = overlong_penalty(lengths, max_len=max_len, cache_len=cache_len, penalty=penalty)
    shaped = rewards.to(torch.float64) + pen
    frac = float((pen < 0).to(torch.float64).mean()) if pen.numel() else 0.0
    return shaped.to(rewards.dtype), {
        "overlong_frac": frac,
        "overlong_penalty_mean": float(pen.mean()) if pen.numel() else 0.0,
    }
