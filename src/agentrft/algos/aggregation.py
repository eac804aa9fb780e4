"""Reduction of a per-token loss to a scalar: token-mean (DAPO), sequence-mean of token-means (GRPO), constant normaliser (Dr. GRPO).

Follows:
* GRPO (arXiv 2402.03300) eq. 3: ``1/G sum_i 1/|o_i| sum_t loss_{i,t}`` — each
  sequence weighs the same whatever its length.
* DAPO (arXiv 2503.14476) §3.3: ``1/sum_i |o_i| sum_i sum_t loss_{i,t}`` — each
  token weighs the same over the whole batch.
* Dr. GRPO (arXiv 2503.20783): ``1/(G * L) sum_i sum_t loss_{i,t}`` with a constant
  L (the generation budget), removing the length bias.

Departure / the point of this module: under gradient accumulation the denominators
are *global* (whole optimisation step, all micro-batches), passed explicitly. A
micro-batch then contributes its share, and micro-batch 1 x accumulation 8 gives
the same update as micro-batch 8 x accumulation 1. No hidden state.

Shape legend: B = sequences in the micro-batch, T = tokens; per_token_loss and
loss_mask are (B, T).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

AggregationMode = Literal["token_mean", "seq_mean_token_mean", "constant"]


def masked_mean(values: Tensor, loss_mask: Tensor) -> Tensor:
    """Mean of ``values`` over tokens kept by ``loss_mask`` (0 when the mask is empty): a metric's reduction."""
    m = loss_mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1.0)


def token_mean(per_token_loss: Tensor, loss_mask: Tensor, *, global_num_tokens: float) -> Tensor:
    """``sum(loss * mask) / global_num_tokens`` (loss-mask tokens of the whole step)."""
    if global_num_tokens <= 0:
        raise ValueError(f"global_num_tokens must be > 0, got {global_num_tokens}")
    return (per_token_loss * loss_mask.to(per_token_loss.dtype)).sum() / global_num_tokens


def seq_mean_token_mean(per_token_loss: Tensor, loss_mask: Tensor, *, global_num_sequences: float) -> Tensor:
    """``sum_i [sum_t loss_{i,t} / |o_i|] / global_num_sequences``; empty sequences add 0."""
    if global_num_sequences <= 0:
        raise ValueError(f"global_num_sequences must be > 0, got {global_num_sequences}")
    m = loss_mask.to(per_token_loss.dtype)
    per_seq = (per_token_loss * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)
    return per_seq.sum() / global_num_sequences


def constant(per_token_loss: Tensor, loss_mask: Tensor, *, normaliser: float) -> Tensor:
    """``sum(loss * mask) / normaliser``; Dr. GRPO uses ``normaliser = num_sequences * max_tokens``."""
    if normaliser <= 0:
        raise ValueError(f"normaliser must be > 0, got {normaliser}")
    return (per_token_loss * loss_mask.to(per_token_loss.dtype)).sum() / normaliser


def aggregate(
    mode: AggregationMode,
    per_token_loss: Tensor,
    loss_mask: Tensor,
    *,
    global_num_tokens: float,
    global_num_sequences: float,
    max_tokens: int,
) -> Tensor:
    """The one place an aggregation mode string is dispatched."""
    if mode == "token_mean":
        return token_mean(per_token_loss, loss_mask, global_num_tokens=global_num_tokens)
    if mode == "seq_mean_token_mean":
        return seq_mean_token_mean(per_token_loss, loss_mask, global_num_sequences=global_num_sequences)
    if mode == "constant":
        return constant(per_token_loss, loss_mask, normaliser=global_num_sequences * max_tokens)
    raise ValueError(f"unknown aggregation mode {mode!r}; valid: token_mean, seq_mean_token_mean, constant")
