"""Per-token clipped policy-gradient loss with asymmetric clipping, truncated IS and k3 KL.

Follows:
* PPO's clipped surrogate (Schulman et al., arXiv 1707.06347) as used by GRPO
  (DeepSeekMath, arXiv 2402.03300), with the k3 KL estimator to a reference policy
  ``exp(ref - logp) - (ref - logp) - 1`` (Schulman, "Approximating KL Divergence").
* DAPO (arXiv 2503.14476) "clip-higher": separate ``eps_low`` / ``eps_high`` bounds
  on the ratio, ``clip(ratio, 1 - eps_low, 1 + eps_high)``.
* Truncated importance sampling for tokens sampled by an older/other policy
  (as in IMPALA/V-trace and the "flash-RL"/verl TIS correction):
  ``w = min(exp(logp_old - logp_sampler), C)``, detached, multiplies the token loss.

Departures: the function returns the *per-token* loss only; reduction over tokens
is a separate, explicit step (`agentrft.algos.aggregation`). The KL term is added
per token (GRPO style) and is computed only when ``kl_coef > 0`` so that runs
without a reference model never need one.

Shape legend: B = sequences in the micro-batch, T = tokens (padded). Every tensor
argument is (B, T); ``loss_mask`` is 1 on tokens the policy sampled.
"""

from __future__ import annotations

import torch
from torch import Tensor

Metrics = dict[str, Tensor]


def masked_mean(values: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean of ``values`` over tokens kept by ``loss_mask`` (0 when the mask is empty)."""
    m = loss_mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1.0)


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def truncated_is_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, cap: float) -> Tensor:
    """``min(exp(logp_old - logp_sampler), cap)``, detached: corrects for tokens from a stale sampler."""
    if cap <= 0:
        raise ValueError(f"truncated IS cap must be > 0, got {cap}")
    return torch.exp(old_logprobs - sampler_logprobs).clamp(max=cap).detach()


def clipped_pg_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    sampler_logprobs: Tensor | None = None,
    is_cap: float | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Per-token loss (B, T) of the clipped surrogate, and detached masked-mean metrics.

    ``loss_t = -w_t * min(ratio_t * A_t, clip(ratio_t, 1-eps_low, 1+eps_high) * A_t) + kl_coef * k3_t``
    with ``ratio_t = exp(logprobs_t - old_logprobs_t)``; ``w_t`` is the truncated IS
    weight when ``sampler_logprobs`` and ``is_cap`` are given, else 1. Tokens outside
    ``loss_mask`` have loss 0.

    Metrics: ``clip_frac`` (tokens where the clipped branch is active, i.e. the
    gradient is zero), ``clip_frac_low`` / ``clip_frac_high``, ``ratio_mean``,
    ``kl`` (only if kl_coef > 0), ``is_weight_mean`` (only with IS), ``entropy``
    (only if given; a metric, never part of the loss).
    """
    if not (eps_low >= 0 and eps_high >= 0):
        raise ValueError(f"eps_low and eps_high must be >= 0, got {eps_low}, {eps_high}")
    mask = loss_mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    surrogate = torch.minimum(ratio * advantages, clipped_ratio * advantages)
    per_token = -surrogate
    metrics: Metrics = {}
    if sampler_logprobs is not None and is_cap is not None:
        w = truncated_is_weights(old_logprobs, sampler_logprobs, is_cap)
        per_token = per_token * w
        metrics["is_weight_mean"] = masked_mean(w, loss_mask).detach()
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = masked_mean(kl, loss_mask).detach()
    per_token = per_token * mask

    with torch.no_grad():
        # The clipped branch is the active one exactly when it is strictly smaller.
        low = (ratio < 1.0 - eps_low) & (advantages < 0)
        high = (ratio > 1.0 + eps_high) & (advantages > 0)
        metrics["clip_frac"] = masked_mean((low | high).to(logprobs.dtype), loss_mask)
        metrics["clip_frac_low"] = masked_mean(low.to(logprobs.dtype), loss_mask)
        metrics["clip_frac_high"] = masked_mean(high.to(logprobs.dtype), loss_mask)
        metrics["ratio_mean"] = masked_mean(ratio, loss_mask)
        if entropy is not None:
            metrics["entropy"] = masked_mean(entropy.detach(), loss_mask)
    return per_token, metrics
