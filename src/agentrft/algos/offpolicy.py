"""Off-policy correction for tokens sampled by older weights: decoupled PPO with truncated or masked IS.

Three policies meet in an asynchronous update (the decoupled PPO objective of AReaL,
Fu et al., arXiv 2505.24298):

* behaviour ``mu``: the weights that sampled the token; its log-prob is the one the
  sampler reported (`TokenRecord.logprobs`), at the sampling distribution's temperature;
* proximal ``pi_prox``: the weights this update starts from (version n when the update
  makes n+1): the trust region is centred here, not on the stale behaviour policy;
* current ``pi_theta``: the weights being optimised.

Per token::

    r_t  = exp(logp_theta - logp_prox)                  trust-region ratio, clipped as PPO/DAPO do
    w_t  = exp(logp_prox - logp_mu)                     behaviour importance weight, detached
    loss = -c(w_t) * min(r_t A_t, clip(r_t, 1-eps_low, 1+eps_high) A_t)

and ``c`` is the correction:

* ``none``: ``c(w) = 1`` (on-policy training, or trusting the stale sample as is);
* ``tis`` (truncated IS, as in IMPALA/V-trace and verl's TIS): ``c(w) = min(w, cap)``;
* ``mis`` (masked IS, IcePop-style): ``c(w) = w`` when ``low <= w <= high``, else 0: a
  token whose weights moved too far is left out of the gradient instead of being
  down-weighted.

When the behaviour policy is the proximal one (synchronous training, staleness 0) the
log-probs agree up to the sampler-vs-trainer numerical gap; `behaviour_weights` with
equal inputs gives weights exactly 1 and masks nothing.

Shape legend: B = sequences, T = tokens (padded); every tensor argument is (B, T) and
``loss_mask`` is 1 on sampled tokens. Metrics are over loss tokens only.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from agentrft.algos.aggregation import masked_mean

Correction = Literal["none", "tis", "mis"]
CORRECTIONS: tuple[Correction, ...] = ("none", "tis", "mis")


def behaviour_weights(
    proximal_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    correction: Correction,
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The detached per-token weights ``c(exp(prox - behaviour))`` and their metrics.

    Metrics: ``is/weight_mean`` and ``is/weight_max`` of the raw ratio ``w`` (before
    truncation or masking), ``is/truncated_frac`` (tis: tokens with ``w > cap``),
    ``is/masked_frac`` (mis: tokens outside ``[low, high]``)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown off-policy correction {correction!r}; valid: {', '.join(CORRECTIONS)}")
    if correction == "tis" and not cap > 0:
        raise ValueError(f"truncated IS cap must be > 0, got {cap}")
    if correction == "mis" and not 0 <= low <= 1 <= high:
        raise ValueError(f"masked IS needs 0 <= low <= 1 <= high, got low={low}, high={high}")
    with torch.no_grad():
        mask = loss_mask.bool()
        raw = torch.exp(proximal_logprobs - behaviour_logprobs)
        kept = raw[mask]
        metrics: dict[str, Tensor] = {
            "is/weight_mean": kept.mean() if kept.numel() else raw.new_tensor(1.0),
            "is/weight_max": kept.max() if kept.numel() else raw.new_tensor(1.0),
        }
        if correction == "none":
            weights = torch.ones_like(raw)
        elif correction == "tis":
            weights = raw.clamp(max=cap)
            metrics["is/truncated_frac"] = masked_mean((raw > cap).to(raw.dtype), loss_mask)
        else:
            inside = (raw >= low) & (raw <= high)
            weights = torch.where(inside, raw, torch.zeros_like(raw))
            metrics["is/masked_frac"] = masked_mean((~inside).to(raw.dtype), loss_mask)
    return weights, metrics


def decoupled_ppo_loss(
    logprobs: Tensor,
    proximal_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    correction: Correction = "tis",
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token loss (B, T) of the decoupled PPO objective (module docstring) and its metrics
    (the `behaviour_weights` metrics unless ``correction`` is none, ``clip_frac`` and its ``_low`` /
    ``_high`` parts, ``ratio_mean``). Tokens outside ``loss_mask`` have loss 0."""
    if not (eps_low >= 0 and eps_high >= 0):
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")
    weights: Tensor | float = 1.0
    metrics: dict[str, Tensor] = {}
    if correction != "none":  # none: no weights to compute on the loss path
        weights, metrics = behaviour_weights(
            proximal_logprobs, behaviour_logprobs, loss_mask, correction=correction, cap=cap, low=low, high=high
        )
    ratio = torch.exp(logprobs - proximal_logprobs)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages)
    per_token = -weights * surrogate * loss_mask.to(logprobs.dtype)
    with torch.no_grad():
        # the clipped branch is the active one (no gradient) exactly when it is strictly smaller
        low_clip = ((ratio < 1.0 - eps_low) & (advantages < 0)).to(logprobs.dtype)
        high_clip = ((ratio > 1.0 + eps_high) & (advantages > 0)).to(logprobs.dtype)
        metrics["clip_frac"] = masked_mean(low_clip + high_clip, loss_mask)
        metrics["clip_frac_low"] = masked_mean(low_clip, loss_mask)
        metrics["clip_frac_high"] = masked_mean(high_clip, loss_mask)
        metrics["ratio_mean"] = masked_mean(ratio, loss_mask)
    return per_token, metrics


def staleness_histogram(staleness: list[int], max_staleness: int) -> dict[str, float]:
    """``staleness/k`` counts for k = 0..max_staleness (and ``staleness/over`` for anything past the bound),
    plus ``staleness/mean`` and ``staleness/max``; staleness is n - v for a trajectory sampled by version v and
    used in the update that makes version n+1."""
    out = {f"staleness/{k}": 0.0 for k in range(max_staleness + 1)}
    over = 0
    for s in staleness:
        if s < 0:
            raise ValueError(f"staleness {s} < 0: a trajectory cannot be sampled by weights newer than the update's")
        if s > max_staleness:
            over += 1
        else:
            out[f"staleness/{s}"] += 1.0
    if over:
        out["staleness/over"] = float(over)
    out["staleness/mean"] = sum(staleness) / len(staleness) if staleness else 0.0
    out["staleness/max"] = float(max(staleness, default=0))
    return out
