"""Filtered SFT / rejection-sampling fine-tuning: negative log-likelihood of the kept trajectories' own tokens.

Follows SPECS §4 (filtered SFT) and, for the repeated form, rejection-sampling fine-tuning
(RFT, Yuan et al., arXiv 2308.01825) and ReST^EM (Singh et al., arXiv 2312.06585): sample
from the current policy, keep what the grader accepts, maximise its likelihood, repeat.

The per-token loss is ``-log pi(y_t | y_<t)`` on loss tokens (the assistant's sampled or
rendered turns) and exactly 0 elsewhere, so system, user and tool tokens are context only:
nothing is learned about predicting them. Reduce it with `aggregation.token_mean` and the
step's global loss-token count, so every assistant token of the step weighs the same
however the step is split into micro-batches. Departure from the papers: none in the loss;
which trajectories are kept (success, reward threshold, best of n per task, deduplication)
is `train.data`'s selection.

Shape legend: B = sequences, T = tokens; every tensor is (B, T).
"""

from __future__ import annotations

from torch import Tensor

from agentrft.algos.aggregation import masked_mean


def nll_loss(logprobs: Tensor, loss_mask: Tensor) -> tuple[Tensor, dict[str, float]]:
    """Per-token NLL ``-logprobs`` where ``loss_mask`` is 1, exactly 0 elsewhere, and its mean over the
    loss tokens of these rows (``nll``) as a metric. ``logprobs[b, t] = log pi(ids[b, t] | ids[b, :t])``."""
    keep = loss_mask.to(logprobs.dtype)
    per_token = -logprobs * keep
    return per_token, {"nll": float(masked_mean(-logprobs.detach(), loss_mask))}
