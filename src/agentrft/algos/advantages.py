"""Advantage estimators for group-based policy gradient (no critic).

Follows:
* GRPO — DeepSeekMath (Shao et al., arXiv 2402.03300) §4.1: per group of G samples
  of one prompt, ``A_i = (r_i - mean(r)) / (std(r) + eps)``.
* Dr. GRPO — "Understanding R1-Zero-Like Training" (Liu et al., arXiv 2503.20783):
  ``A_i = r_i - mean(r)``, no division by the standard deviation (which up-weights
  groups that are nearly all right or all wrong).
* RLOO — Ahmadian et al. (arXiv 2402.14740): ``A_i = r_i - mean_{j != i} r_j``.
* Turn-level credit — DeepSeekMath §4.1.3 "process supervision", adapted to agent
  turns: a turn's process reward is centred on its siblings' from the same state (GiGPO's
  anchor states, arXiv 2505.10978), with no return-to-go and each sample weighing 1 in the
  scale; `turn_level` states the formula and the audit.

Departures: groups are given as an index vector (samples of one group need not be
contiguous and groups may differ in size, e.g. after failed episodes); the standard
deviation is the unbiased one (Bessel, as ``torch.std``); a group of one sample
gets advantage 0 (it carries no relative signal) instead of NaN.

Shape legend: N = number of samples (all groups together), K = number of assistant
turns of one sample. ``group_index`` (N,) holds the group number of each sample.
Every estimator returns ``(advantages, metrics)``; none mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

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
    # a group whose rewards all agree: its mean is that reward and its std 0 exactly, so every advantage of it is
    # exactly 0 (a sum of n equal floats divided by n can be one ulp off)
    lo = torch.full((num_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, group_index, r, "amin")
    hi = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, group_index, r, "amax")
    flat = lo == hi
    mean = torch.where(flat, lo, mean)
    var = torch.where(flat, torch.zeros_like(var), var)
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
    states: Sequence[Sequence[Hashable]] | None = None,
    turn_weight: float = 1.0,
    eps: float = 1e-6,
) -> tuple[list[Tensor], Metrics]:
    """Per-turn advantages: the outcome advantage plus the turn's process reward against the other turns taken
    from the same state.

    ``states[i][k]`` names the state sample i acted from at turn k (`train.stages.turn_states`: the history before
    the turn, so two turns share a state exactly when everything before them is the same; default: the turn
    index). For group g with G samples (those with at least one turn), sample i having K_i turns with rewards
    ``r_{i,k}``:

        S(i,k)    = the turns of group g taken from state states[i][k] (i's own included)
        b_{i,k}   = mean of r over S(i,k)                                   # a sibling baseline
        d_{i,k}   = r_{i,k} - b_{i,k}                                       # exactly 0 where S's rewards agree
        sigma_g^2 = 1/(G-1) * sum_i (1/K_i) sum_k d_{i,k}^2                 # 0 when G = 1
        z_{i,k}   = d_{i,k} / (sigma_g + eps)
        A_{i,k}   = A_i + turn_weight * z_{i,k}

    What is normalised over what: a turn's process reward is centred on what the group's other turns from the
    same state earned (the anchor-state grouping of GiGPO, Feng et al., arXiv 2505.10978, applied to one step's
    reward), and scaled by one deviation per group in which each sample weighs 1 whatever its length. With one
    turn per sample every turn acts from the prompt, and this is exactly GRPO's ``(r_i - mean) / (std + eps)``
    of the turn rewards (Bessel over samples). A turn no sibling took from its state has d = 0: nothing to
    compare it with, its credit is the outcome's. Every token of turn k gets ``A_{i,k}``
    (`broadcast_turn_advantages`).

    Audited against two naive normalisations. (a) Pooling every turn of the group (one mean over all turns):
    a process reward pays milestones (a search listing the report, the page opened, the figures calculated)
    and nothing for the final answer, so in a group of identical, correct episodes [1, 1, 1, 0] the answer
    turn got z = -1.5 and the calls +0.5: a push away from answering, with no difference between the samples
    to justify it (measured: 3 of the 4 groups of an agentic RL step were such groups; they also cost a
    forward and backward where nothing was to be learned). Here every such group has z = 0. (b) DeepSeekMath
    §4.1.3's return-to-go of pooled z: biased by length as well, e.g. turn rewards [1, 1, 1, 0] and [1, 0]
    (both answered right, A = 0) give their identical first turns +0.645 and -0.645. Centring per turn index
    (the default without ``states``) compares turns at different stages once episodes diverge (turn 2 an
    `open` in one and the answer in another); states compare only turns taken from the same history.

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
    if states is None:
        states = [list(range(len(rs))) for rs in turn_rewards]
    if len(states) != n or any(len(s) != len(rs) for s, rs in zip(states, turn_rewards, strict=True)):
        raise ValueError("turn_level: states must name one state per turn reward of every sample")
    # the turns of each (group, state), then each turn's deviation from their mean
    members: dict[tuple[int, Hashable], list[float]] = {}
    for i, rs in enumerate(turn_rewards):
        for k, r in enumerate(rs):
            members.setdefault((int(group_index[i]), states[i][k]), []).append(float(r))
    dev: list[list[float]] = []
    for i, rs in enumerate(turn_rewards):
        row = []
        for k, r in enumerate(rs):
            peers = members[(int(group_index[i]), states[i][k])]
            row.append(0.0 if max(peers) == min(peers) else float(r) - sum(peers) / len(peers))
        dev.append(row)
    groups = [int(g) for g in group_index.tolist()]
    sq: dict[int, float] = {}
    size: dict[int, int] = {}
    for i, row in enumerate(dev):
        if row:
            sq[groups[i]] = sq.get(groups[i], 0.0) + sum(d * d for d in row) / len(row)
            size[groups[i]] = size.get(groups[i], 0) + 1
    sigma = {g: (sq[g] / (size[g] - 1)) ** 0.5 if size[g] > 1 else 0.0 for g in sq}
    out: list[Tensor] = []
    for i, row in enumerate(dev):
        z = torch.tensor(row, dtype=torch.float64) / (sigma.get(groups[i], 0.0) + eps)
        out.append((float(outcome_advantages[i]) + turn_weight * z).to(outcome_advantages.dtype))
    cat = torch.cat(out) if out else torch.zeros(0)
    return out, _metrics(cat, "turn_adv")


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
