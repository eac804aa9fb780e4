"""Advantage estimators for group-based policy gradient (no critic).

Follows:
* GRPO — DeepSeekMath (Shao et al., arXiv 2402.03300) §4.1: per group of G samples
  of one prompt, ``A_i = (r_i - mean(r)) / (std(r) + eps)``.
* Dr. GRPO — "Understanding R1-Zero-Like Training" (Liu et al., arXiv 2503.20783):
  ``A_i = r_i - mean(r)``, no division by the standard deviation (which up-weights
  groups that are nearly all right or all wrong).
* RLOO — Ahmadian et al. (arXiv 2402.14740): ``A_i = r_i - mean_{j != i} r_j``.
* Turn-level credit — DeepSeekMath §4.1.3 "process supervision", adapted to agent
  turns and departing from it where it is biased by trajectory length (no return-to-go,
  each sample weighs 1 in the turn statistics); `turn_level` states the formula and the audit.

Departures: groups are given as an index vector (samples of one group need not be
contiguous and groups may differ in size, e.g. after failed episodes); the standard
deviation is the unbiased one (Bessel, as ``torch.std``); a group of one sample
gets advantage 0 (it carries no relative signal) instead of NaN.

Shape legend: N = number of samples (all groups together), K = number of assistant
turns of one sample. ``group_index`` (N,) holds the group number of each sample.
Every estimator returns ``(advantages, metrics)``; none mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

Metrics = dict[str, float]
AdvantageFn = Callable[..., tuple[Tensor, Metrics]]


def _check(rewards: Tensor, group_index: Tensor) -> None:
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both have shape (N,), got {tuple(rewards.shape)} "
            f"and {tuple(group_index.shape)}"
        )
    if group_index.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"group_index must be an integer tensor, got {group_index.dtype}")
    if rewards.numel() and int(group_index.min()) < 0:
        raise ValueError("group_index must be non-negative")


def group_stats(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group mean, unbiased group std and group size, each (N,).

    Computed with scatter-adds so the result does not depend on sample order.
    Groups of one sample get std 0.
    """
    _check(rewards, group_index)
    r = rewards.to(torch.float64)  # the variance of nearly-equal rewards loses digits in fp32
    num_groups = int(group_index.max()) + 1 if r.numel() else 0
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, torch.ones_like(r))
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, r)
    mean = sums / counts.clamp(min=1)
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_index, (r - mean[group_index]) ** 2)
    var = torch.where(counts > 1, sq / (counts - 1).clamp(min=1), torch.zeros_like(sq))
    return mean[group_index], var.sqrt()[group_index], counts[group_index]


def _metrics(adv: Tensor, prefix: str = "adv") -> Metrics:
    if adv.numel() == 0:
        return {f"{prefix}_mean": 0.0, f"{prefix}_std": 0.0, f"{prefix}_abs_max": 0.0}
    return {
        f"{prefix}_mean": float(adv.mean()),
        f"{prefix}_std": float(adv.std()) if adv.numel() > 1 else 0.0,
        f"{prefix}_abs_max": float(adv.abs().max()),
    }


def grpo(rewards: Tensor, group_index: Tensor, *, eps: float = 1e-6) -> tuple[Tensor, Metrics]:
    """GRPO outcome advantage ``(r_i - mean_g) / (std_g + eps)``; (N,) -> (N,)."""
    mean, std, _ = group_stats(rewards, group_index)
    adv = ((rewards.to(torch.float64) - mean) / (std + eps)).to(rewards.dtype)
    return adv, _metrics(adv)


def dr_grpo(rewards: Tensor, group_index: Tensor, *, eps: float = 1e-6) -> tuple[Tensor, Metrics]:
    """Dr. GRPO outcome advantage ``r_i - mean_g`` (``eps`` unused, kept for a uniform signature)."""
    del eps
    mean, _, _ = group_stats(rewards, group_index)
    adv = (rewards.to(torch.float64) - mean).to(rewards.dtype)
    return adv, _metrics(adv)


def rloo(rewards: Tensor, group_index: Tensor, *, eps: float = 1e-6) -> tuple[Tensor, Metrics]:
    """RLOO leave-one-out baseline ``r_i - mean_{j != i} r_j`` = ``G/(G-1) (r_i - mean_g)``.

    A group of one sample has no other sample to compare with and gets 0.
    """
    del eps
    mean, _, count = group_stats(rewards, group_index)
    scale = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.zeros_like(count))
    adv = (scale * (rewards.to(torch.float64) - mean)).to(rewards.dtype)
    return adv, _metrics(adv)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}


def get_advantage_estimator(name: str) -> AdvantageFn:
    """The outcome estimator called `name`; an unknown name lists the valid ones."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        valid = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise KeyError(f"unknown advantage estimator {name!r}; valid names: {valid}") from None


def turn_level(
    outcome_advantages: Tensor,
    turn_rewards: Sequence[Sequence[float]],
    num_turns: Sequence[int],
    group_index: Tensor,
    *,
    turn_weight: float = 1.0,
    eps: float = 1e-6,
) -> tuple[list[Tensor], Metrics]:
    """Per-turn advantages: the outcome advantage plus the turn's own group-normalised process reward.

    For group g with G samples (those with at least one turn), sample i having K_i turns with
    rewards ``r_{i,1..K_i}``:

        mu_g      = (1/G) sum_i (1/K_i) sum_k r_{i,k}                      # each SAMPLE weighs 1
        sigma_g^2 = G/(G-1) * (1/G) sum_i (1/K_i) sum_k (r_{i,k} - mu_g)^2  # 0 when G = 1
        z_{i,k}   = (r_{i,k} - mu_g) / (sigma_g + eps)
        A_{i,k}   = A_i + turn_weight * z_{i,k}

    What is normalised over what: every turn reward of the group is centred and scaled by one
    mean and one standard deviation of the group, taken over all its turns (not per turn index)
    with each turn weighted 1/K_i, so each sample counts once whatever its length. With one turn
    per sample this is exactly GRPO's ``(r_i - mean) / (std + eps)`` of the turn rewards (Bessel
    over samples). Every token of turn k gets ``A_{i,k}`` (`broadcast_turn_advantages`). A group
    whose turn rewards all agree has z = 0 and falls back to the outcome advantage.

    Departure from DeepSeekMath §4.1.3 (process supervision), audited: there, step rewards are
    normalised over all steps pooled (each step weighs 1) and a step's advantage is the SUM of
    the normalised rewards from it to the end (return-to-go). With trajectories of different
    lengths that is biased by length: (a) a turn's credit grows with the number of turns after
    it, so the same action is worth more in a longer trajectory whose later turns are above the
    pooled mean, and less in one whose later turns are below it; e.g. turn rewards [1, 1, 1, 0]
    and [1, 0] (both answered right, A = 0) give their identical first turns +0.645 and -0.645;
    (b) a sample with K turns puts K values into the mean and std, so long trajectories set the
    baseline the short ones are judged by. Normalising per turn index instead compares turns at
    different stages (turn 2 is an `open` in one episode and the answer in another) and judges
    late turns only against the long trajectories that reach them. Here a turn is credited by its
    own reward alone; credit for what a turn enabled later is the outcome advantage's, which every
    turn carries.

    Nothing is dropped: ``len(turn_rewards[i])`` must equal ``num_turns[i]`` (the number
    of assistant turns in the sample's token record), else ValueError.

    Shapes: outcome_advantages (N,), group_index (N,); returns N tensors of shape (K_i,).
    """
    n = outcome_advantages.shape[0]
    if len(turn_rewards) != n or len(num_turns) != n or group_index.shape != (n,):
        raise ValueError(
            f"turn_level: got {n} outcome advantages, {len(turn_rewards)} turn-reward lists, "
            f"{len(num_turns)} turn counts and group_index of shape {tuple(group_index.shape)}"
        )
    for i, (rs, k) in enumerate(zip(turn_rewards, num_turns, strict=True)):
        if len(rs) != k:
            raise ValueError(
                f"turn_level: sample {i} has {len(rs)} turn rewards but {k} assistant turns; "
                "a turn reward may not be dropped or invented"
            )
    flat = torch.tensor([r for rs in turn_rewards for r in rs], dtype=torch.float64)
    flat_group = torch.tensor([int(group_index[i]) for i, rs in enumerate(turn_rewards) for _ in rs], dtype=torch.int64)
    weight = torch.tensor([1.0 / len(rs) for rs in turn_rewards for _ in rs], dtype=torch.float64)
    if flat.numel():
        mean, std = _sample_weighted_stats(flat, flat_group, weight)
        z = (flat - mean) / (std + eps)
    else:
        z = flat
    out: list[Tensor] = []
    offset = 0
    for i, rs in enumerate(turn_rewards):
        zi = z[offset : offset + len(rs)]
        offset += len(rs)
        out.append((float(outcome_advantages[i]) + turn_weight * zi).to(outcome_advantages.dtype))
    cat = torch.cat(out) if out else torch.zeros(0)
    return out, _metrics(cat, "turn_adv")


def _sample_weighted_stats(values: Tensor, group: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-value group mean and std (see `turn_level`): weights sum to 1 per sample, so to G per group."""
    num_groups = int(group.max()) + 1
    samples = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, weight)  # G per group
    mean = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, weight * values) / samples.clamp(
        min=1e-300
    )
    dev = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, weight * (values - mean[group]) ** 2)
    g = samples.round()  # sums of 1/K_i over K_i terms: integers up to rounding
    var = torch.where(g > 1, dev / (g - 1).clamp(min=1), torch.zeros_like(dev))
    return mean[group], var.sqrt()[group]


def broadcast_turn_advantages(turn_advantages: Tensor, token_turn: Tensor, loss_mask: Tensor) -> Tensor:
    """Per-token advantages (T,) from per-turn ones (K,): token t gets ``turn_advantages[token_turn[t]]``.

    Tokens outside the loss mask get 0. Raises if a sampled token names a turn with
    no advantage, or if a turn has no sampled token (its reward would be dropped).
    """
    k = turn_advantages.shape[0]
    sampled_turns = token_turn[loss_mask.bool()]
    if sampled_turns.numel() and (int(sampled_turns.max()) >= k or int(sampled_turns.min()) < 0):
        raise ValueError(
            f"a sampled token belongs to turn {int(sampled_turns.max())} but only {k} turn advantages exist"
        )
    present = set(sampled_turns.tolist())
    missing = [t for t in range(k) if t not in present]
    if missing:
        raise ValueError(f"turns {missing} have an advantage but no sampled token; their reward would be dropped")
    idx = token_turn.clamp(0, max(k - 1, 0))
    gathered = turn_advantages[idx] if k else torch.zeros_like(token_turn, dtype=turn_advantages.dtype)
    return torch.where(loss_mask.bool(), gathered, torch.zeros_like(gathered))
