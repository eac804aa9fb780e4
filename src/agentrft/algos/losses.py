"""Per-token clipped policy-gradient loss with asymmetric clipping, truncated IS and k3 KL.

Follows:
* PPO's clipped surrogate (Schulman et al., arXiv 1707.06347) as used by GRPO
  (DeepSeekMath, arXiv 2402.03300), with the k3 KL estimator to a reference policy
  ``exp(ref - logp) - (ref - logp) - 1`` (Schulman, "Approximating KL Divergence").
* DAPO (arXiv 2503.14476) "clip-higher": separate ``eps_low`` / ``eps_high`` bounds
  on the ratio, ``clip(ratio, 1 - eps_low, 1 + eps_high)``.
* Off-policy correction for tokens sampled by an older/other policy: the decoupled
  objective and truncated / masked IS of `agentrft.algos.offpolicy` (this function is
  that objective plus the KL term).

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

from agentrft.algos.aggregation import masked_mean
from agentrft.algos.offpolicy import Correction, decoupled_ppo_loss

Metrics = dict[str, Tensor]


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def clipped_pg_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    sampler_logprobs: Tensor | None = None,
    correction: Correction = "none",
    is_cap: float = 2.0,
    is_low: float = 0.5,
    is_high: float = 2.0,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Per-token loss (B, T) of the clipped surrogate, and detached masked-mean metrics.

    ``loss_t = -c(w_t) * min(ratio_t * A_t, clip(ratio_t, 1-eps_low, 1+eps_high) * A_t) + kl_coef * k3_t``
    with ``ratio_t = exp(logprobs_t - old_logprobs_t)``: the decoupled PPO objective of
    `algos.offpolicy.decoupled_ppo_loss`, ``old_logprobs`` being the proximal policy's and
    ``sampler_logprobs`` the behaviour policy's (``w_t = exp(old - sampler)``, corrected by
    ``correction``: none, tis (cap ``is_cap``) or mis (kept inside ``[is_low, is_high]``)).
    Without ``sampler_logprobs`` there is no correction. Tokens outside ``loss_mask`` have loss 0.

    Metrics: ``clip_frac`` (tokens where the clipped branch is active, i.e. the
    gradient is zero), ``clip_frac_low`` / ``clip_frac_high``, ``ratio_mean``,
    ``kl`` (only if kl_coef > 0), ``is/*`` (with a correction: see
    `offpolicy.behaviour_weights`), ``entropy`` (only if given; a metric, never part of the loss).
    """
    if sampler_logprobs is None:
        sampler_logprobs, correction = old_logprobs, "none"
    per_token, metrics = decoupled_ppo_loss(
        logprobs,
        old_logprobs,
        sampler_logprobs,
        advantages,
        loss_mask,
        eps_low=eps_low,
        eps_high=eps_high,
        correction=correction,
        cap=is_cap,
        low=is_low,
        high=is_high,
    )
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = k3_kl(logprobs, ref_logprobs)
        per_token = per_token + kl_coef * kl * loss_mask.to(logprobs.dtype)
        metrics["kl"] = masked_mean(kl, loss_mask).detach()
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy.detach(), loss_mask)
    return per_token, metrics
