"""The policy update: micro-batches -> per-token loss -> aggregated loss -> AdamW step.

Global denominators (loss tokens and sequences of the whole step) are counted once
before the first micro-batch and passed to the aggregation explicitly, so the
update does not depend on how the step is split into micro-batches.

With ``updates_per_batch == 1`` the step is on-policy: the "old" log-probs are the
current ones detached, so every ratio is exactly 1 and the clipped objective
reduces to the plain policy gradient (the sampler's own log-probs, which may differ
by numerics, enter only through the optional truncated IS weight). With more
updates per batch, old log-probs come from one no-grad pass before the first step.

A micro-batch packed as a prefix tree (``optimizer.shared_prefix``, see shared_prefix.py)
runs its shared prompt tokens once; the loss sees the same (B, T) per-sequence tensors
either way, so the aggregation and its global denominators do not change.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch

from agentrft.algos import aggregate, clipped_pg_loss
from agentrft.memory import trim
from agentrft.precision import resolve
from agentrft.samplers.distribution import Distribution
from agentrft.train.config import OptimizerConfig
from agentrft.train.config.algorithm import AlgorithmConfig
from agentrft.train.core.logprobs import sampled_logprobs
from agentrft.train.core.packing import MicroBatch
from agentrft.train.core.shared_prefix import shared_prefix_logprobs


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The trainer's autocast dtype for ``policy.precision`` (``auto``: `precision.resolve`)."""
    return torch.bfloat16 if resolve(precision) == "bf16" else None


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None) -> Iterator[None]:
    if dtype is None:
        yield
    else:
        # no weight-cast cache: it would hold a bf16 copy of every weight until the context exits (+270 MB at
        # 135M parameters); a micro-batch uses each weight once (twice when tied), so re-casting costs ~nothing
        with torch.autocast("cpu", dtype=dtype, cache_enabled=False):
            yield


def make_optimizer(params: list[torch.nn.Parameter], opt: OptimizerConfig) -> torch.optim.Optimizer:
    """AdamW with fp32 states. Fused where torch has a fused kernel for the parameters' device: one pass
    per tensor and no temporaries, where the default multi-tensor ("foreach") step allocates scratch
    copies the size of all parameters together (+540 MB at 135M parameters). ``opt.weights == "bf16"``:
    AdamW on bf16 parameters with bf16 states and stochastic rounding, stepped in chunks
    (`train/core/bf16_adamw.py`)."""
    kwargs: dict[str, Any] = {"lr": opt.lr, "betas": opt.betas, "weight_decay": opt.weight_decay}
    if opt.weights == "bf16":
        from agentrft.train.core.bf16_adamw import Bf16AdamW

        return Bf16AdamW(params, **kwargs)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.AdamW(params, foreach=False, **kwargs)


def lr_lambda(opt: OptimizerConfig, total_steps: int) -> Any:
    """Multiplier of the base LR at scheduler step s: linear warmup, then constant/linear/cosine decay."""

    def f(step: int) -> float:
        if opt.warmup_steps and step < opt.warmup_steps:
            return (step + 1) / opt.warmup_steps
        if opt.schedule == "constant":
            return 1.0
        span = max(1, total_steps - opt.warmup_steps)
        frac = min(1.0, (step - opt.warmup_steps) / span)
        return 1.0 - frac if opt.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))

    return f


def batch_logprobs(
    model: Any, mb: MicroBatch, *, chunk: int, dist: Distribution, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-probs and entropy of ``mb``'s sampled tokens: on its prefix-tree packing if it has one."""
    if mb.shared is not None:
        return shared_prefix_logprobs(
            model, mb.shared, mb.input_ids, mb.loss_mask, chunk_size=chunk, with_entropy=with_entropy, dist=dist
        )
    return sampled_logprobs(
        model, mb.input_ids, mb.attention_mask, mb.loss_mask, chunk_size=chunk, with_entropy=with_entropy, dist=dist
    )


def _ref_logprobs(ref_model: Any, model: Any, mb: MicroBatch, chunk: int, dist: Distribution) -> torch.Tensor:
    """Reference log-probs: a frozen copy, or (LoRA) the same model with the adapter disabled."""
    with torch.no_grad():
        if ref_model is not None:
            return batch_logprobs(ref_model, mb, chunk=chunk, dist=dist, with_entropy=False)[0]
        with model.disable_adapter():
            return batch_logprobs(model, mb, chunk=chunk, dist=dist, with_entropy=False)[0]


def _sampler_gap(logp: torch.Tensor, mb: MicroBatch) -> tuple[float, float]:
    """(sum, max) over loss tokens of |trainer log-prob - sampler log-prob|: on the first pass of an
    on-policy step this is numerical noise only (bf16 autocast against the sampler's fp32), and a
    large value means the two do not compute the same distribution. Tokens with no sampler log-prob (NaN: an
    expert's, `stages.guided_rollout_stage`) are left out."""
    keep = mb.loss_mask.bool() & torch.isfinite(mb.sampler_logprobs)
    if not bool(keep.any()):
        return 0.0, 0.0
    gap = (logp.detach().double() - mb.sampler_logprobs.double()).abs()[keep]
    return float(gap.sum()), float(gap.max())


LossFn = Callable[[MicroBatch, int], tuple[torch.Tensor, dict[str, float]]]


def optimizer_steps(
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batches: list[MicroBatch],
    loss_fn: LossFn,
    opt: OptimizerConfig,
    *,
    epochs: int = 1,
) -> dict[str, float]:
    """The update every method shares: ``epochs`` optimizer steps over ``batches`` (gradients accumulated
    over micro-batches, clipped to ``opt.grad_clip``), then one scheduler step; gradients freed after.

    ``loss_fn(mb, epoch)`` returns the micro-batch's share of the step's loss (already divided by the
    step's global denominator, so the sum over micro-batches is the step's loss whatever the split) and
    its metrics, weighted likewise. Returns ``loss`` and the metrics (means over epochs), ``grad_norm``
    (of the last epoch) and ``lr``. The caller sets train mode and autocast inside ``loss_fn``."""
    params = [p for p in model.parameters() if p.requires_grad]
    sums: dict[str, float] = {}
    loss_total = 0.0
    grad_norm = 0.0
    for epoch in range(epochs):
        optimizer.zero_grad(set_to_none=True)
        for mb in batches:
            loss, m = loss_fn(mb, epoch)
            trim()  # what the forward freed goes back before the backward allocates gradients (~1 ms)
            loss.backward()
            loss_total += float(loss.detach())
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v / epochs
        if not batches:  # every micro-batch skipped as zero-gradient: step as computing them would have (AdamW's
            for p in params:  # moments decay; a None gradient would leave a parameter out of the step)
                p.grad = torch.zeros_like(p)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, opt.grad_clip))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # gradients are not needed until the next update: free them
    scheduler.step()
    return {**sums, "loss": loss_total / epochs, "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0]}


def batch_stats(batches: list[MicroBatch]) -> dict[str, float]:
    """Token and sequence counts of a step's micro-batches (what ran through the model, and its padding)."""
    return {
        "train_tokens": float(sum(mb.num_loss_tokens for mb in batches)),
        "train_sequences": float(sum(len(mb.seq_index) for mb in batches)),
        "train_forward_tokens": float(sum(mb.num_forward_tokens for mb in batches)),
        "train_sequence_tokens": float(sum(int(mb.attention_mask.sum()) for mb in batches)),
        "train_padded_tokens": float(
            sum((mb.shared.input_ids if mb.shared is not None else mb.input_ids).numel() for mb in batches)
        ),
    }


def step_counts(batches: list[MicroBatch]) -> tuple[int, int] | None:
    """(loss tokens, sequences) of the whole step, the global denominators; None when there is nothing to learn."""
    tokens = sum(mb.num_loss_tokens for mb in batches)
    return (tokens, sum(len(mb.seq_index) for mb in batches)) if tokens else None


def policy_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batches: list[MicroBatch],
    algo: AlgorithmConfig,
    opt: OptimizerConfig,
    *,
    dist: Distribution,
    precision: torch.dtype | None = None,
    ref_model: Any = None,
    correction: Literal["none", "tis", "mis"] = "none",
    skipped: tuple[int, int] = (0, 0),
) -> dict[str, float]:
    """GRPO's update: ``algo.updates_per_batch`` optimizer steps of the clipped policy-gradient loss on
    ``batches``; metrics are loss-token-weighted means (``is/weight_max``: the max). ``skipped``: the (loss
    tokens, sequences) of the step's zero-advantage trajectories left out of ``batches``
    (`stages.skip_zero_advantage`), counted in the loss's denominators as if they had been computed.
    ``correction`` weighs each token by its behaviour importance weight (the sampler's log-probs
    against this update's starting weights; `algos.offpolicy`): asynchronous training sets it.

    ``dist`` is the rollout's sampling distribution: the trained log-probs are those of the policy
    the sampler drew from. ``sampler_logprob_gap_mean``/``_max`` compare the first pass's log-probs
    with the sampler's, token by token (see `_sampler_gap`)."""
    counts = step_counts(batches) or (0, 0)
    global_tokens, global_seqs = counts[0] + skipped[0], counts[1] + skipped[1]
    if not global_tokens:
        return {"update_skipped": 1.0}
    model.train()
    if algo.updates_per_batch > 1:
        with torch.no_grad(), autocast(precision):
            for mb in batches:
                mb.old_logprobs = batch_logprobs(model, mb, chunk=opt.logprob_chunk, dist=dist, with_entropy=False)[0]
    gap = [0.0, 0.0]  # sum and max over the first pass
    peak = [0.0]  # largest behaviour importance weight

    def loss_fn(mb: MicroBatch, epoch: int) -> tuple[torch.Tensor, dict[str, float]]:
        with autocast(precision):
            logp, ent = batch_logprobs(model, mb, chunk=opt.logprob_chunk, dist=dist)
        if epoch == 0:
            mb_gap_sum, mb_gap_max = _sampler_gap(logp, mb)
            gap[0], gap[1] = gap[0] + mb_gap_sum, max(gap[1], mb_gap_max)
        old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
        ref = _ref_logprobs(ref_model, model, mb, opt.logprob_chunk, dist) if algo.kl_coef > 0 else None
        per_token, m = clipped_pg_loss(
            logp,
            old,
            mb.advantages,
            mb.loss_mask,
            eps_low=algo.eps_low,
            eps_high=algo.eps_high,
            sampler_logprobs=mb.sampler_logprobs if correction != "none" else None,
            correction=correction,
            is_cap=algo.off_policy.cap,
            is_low=algo.off_policy.low,
            is_high=algo.off_policy.high,
            ref_logprobs=ref,
            kl_coef=algo.kl_coef,
            entropy=ent,
        )
        loss = aggregate(
            algo.aggregation,
            per_token,
            mb.loss_mask,
            global_num_tokens=global_tokens,
            global_num_sequences=global_seqs,
            max_tokens=algo.constant_max_tokens,
        )
        w = mb.num_loss_tokens / counts[0]  # metrics: means over the tokens computed
        if "is/weight_max" in m:
            peak[0] = max(peak[0], float(m.pop("is/weight_max")))
        return loss, {k: w * float(v) for k, v in m.items()}

    out = optimizer_steps(model, optimizer, scheduler, batches, loss_fn, opt, epochs=algo.updates_per_batch)
    for mb in batches:
        mb.old_logprobs = None
    out.update(sampler_logprob_gap_mean=gap[0] / max(counts[0], 1), sampler_logprob_gap_max=gap[1])
    out.update(batch_stats(batches))  # a skipped trajectory is trained on (in the loss), with no work to do
    out["train_tokens"] += skipped[0]
    out["train_sequences"] += skipped[1]
    out.update(train_skipped_tokens=float(skipped[0]), train_skipped_sequences=float(skipped[1]))
    if correction != "none":
        out["is/weight_max"] = peak[0]
    return out
