"""A request's decoding state (`RowState`), its random generator, and how each row's next token is chosen
(`choose_tokens`), for the decode engine (`hf_decode.RunningBatch`).

Log-probs: each returned log-prob is that of the distribution the token was
sampled from, `log_softmax(Distribution.warp(logits))[token]` (temperature,
top-k and top-p applied); the trainer recomputes the same quantity with the
same `Distribution`, so the two are comparable (see `samplers.distribution`).
Greedy rows report the raw temperature-1 log-prob.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from agentrft.samplers.base import FinishReason, SamplingParams
from agentrft.samplers.distribution import Distribution


@dataclass
class RowState:
    """Decoding state of one request."""

    params: SamplingParams
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    owner: Any = None  # the caller's handle (HFSampler: the request and its future)
    prompt_ids: list[int] = field(default_factory=list)  # what the row was prefilled with (set by `admit`)


def make_generator(params: SamplingParams, device: torch.device, seed: int) -> torch.Generator | None:
    """A per-request generator, so that a request's samples depend on its seed alone,
    not on what else shares its batch. Greedy needs none."""
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def choose_tokens(logits: torch.Tensor, rows: list[RowState]) -> tuple[list[int], list[float]]:
    """Pick one token per live row. `logits` is [A, V]; returns ids and their log-probs under the
    distribution each row samples from (`Distribution.warp`; greedy rows: the raw log-prob)."""
    logits = logits.float()
    chosen = torch.argmax(logits, dim=-1)  # greedy rows keep this
    lps = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])[:, 0]
    by_dist: dict[Distribution, list[int]] = {}
    for i, r in enumerate(rows):
        if not r.params.greedy:
            by_dist.setdefault(Distribution.of(r.params), []).append(i)
    for dist, members in by_dist.items():
        idx = torch.tensor(members, device=logits.device)
        x = dist.warp(logits.index_select(0, idx))
        probs = torch.softmax(x, dim=-1)
        picked = torch.stack(
            [torch.multinomial(probs[j], 1, generator=rows[i].generator)[0] for j, i in enumerate(members)]
        )
        chosen[idx] = picked
        lps[idx] = torch.log_softmax(x, dim=-1).gather(1, picked[:, None])[:, 0]
    return chosen.tolist(), lps.tolist()
