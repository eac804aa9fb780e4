"""DAPO dynamic sampling (arXiv 2503.14476 §3.2): drop groups whose rewards all agree.

A group where every sample gets the same reward has zero advantage under
GRPO/Dr. GRPO/RLOO and gives no gradient; it only dilutes the token-mean. DAPO
over-samples and keeps filling the batch with informative groups. Departure: the
training loop caps the number of extra sampling rounds (``max_rounds``) and trains
on whatever it has when the cap is hit, reporting it, instead of sampling forever
on a task set that is all solved or all failed.

Groups are given as lists of rewards (one list per group).
"""

from __future__ import annotations

from collections.abc import Sequence


def is_zero_signal(rewards: Sequence[float], *, atol: float = 1e-9) -> bool:
    """True when every reward of the group equals the first within ``atol`` (or the group has < 2 samples)."""
    if len(rewards) < 2:
        return True
    return max(rewards) - min(rewards) <= atol


def filter_groups(groups: Sequence[Sequence[float]], *, atol: float = 1e-9) -> tuple[list[int], dict[str, float]]:
    """Indices of the groups to keep (rewards not all equal), and stats.

    Stats: ``groups_total``, ``groups_kept``, ``zero_signal_frac`` (fraction dropped).
    """
    keep = [i for i, g in enumerate(groups) if not is_zero_signal(g, atol=atol)]
    total = len(groups)
    return keep, {
        "groups_total": float(total),
        "groups_kept": float(len(keep)),
        "zero_signal_frac": (total - len(keep)) / total if total else 0.0,
    }
