"""Preference losses on sequence log-probs: DPO, IPO and length-normalised DPO.

* ``sigmoid`` — DPO (Rafailov et al., arXiv 2305.18290, eq. 7):
  ``loss = -log sigmoid(beta * h)``, ``h = (logpi(y_w) - logpi_ref(y_w)) - (logpi(y_l) - logpi_ref(y_l))``.
  At initialisation (pi = pi_ref) ``h = 0`` and every pair's loss is ``log 2``.
* ``ipo`` — IPO (Azar et al., arXiv 2310.12036, eq. 17): ``loss = (h - 1/(2 beta))**2``, beta
  being the paper's tau. Unlike TRL's ``ipo`` it uses summed log-probs, as SPECS §4 states it.
* ``sigmoid_norm`` — DPO on length-normalised log-probs: each of the four log-probs divided
  by its sequence's number of loss tokens before ``h`` is formed (the normalisation of
  SimPO/R-DPO applied to DPO's log-ratio), so long answers are not favoured by length alone.

Every function returns per-pair losses; the caller aggregates them (a micro-batch sums its
pairs' losses and divides by the step's pair count, so the split into micro-batches does not
change the step). Metrics are per-pair and detached: the implicit rewards
``beta * (logpi - logpi_ref)`` of chosen and rejected (normalised for ``sigmoid_norm``), their
difference (``margin``) and whether it is positive (``accuracy``), as TRL reports them.

Shape legend: P = number of preference pairs; every input is (P,).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch.nn.functional as F
from torch import Tensor

PreferenceLossName = Literal["sigmoid", "ipo", "sigmoid_norm"]


def _sigmoid(h: Tensor, beta: float) -> Tensor:
    return -F.logsigmoid(beta * h)


def _ipo(h: Tensor, beta: float) -> Tensor:
    return (h - 1.0 / (2.0 * beta)) ** 2


# name -> (loss of h, whether log-probs are divided by their loss-token counts)
PREFERENCE_LOSSES: dict[str, tuple[Callable[[Tensor, float], Tensor], bool]] = {
    "sigmoid": (_sigmoid, False),
    "ipo": (_ipo, False),
    "sigmoid_norm": (_sigmoid, True),
}


def preference_loss(
    name: str,
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    *,
    beta: float,
    chosen_tokens: Tensor,
    rejected_tokens: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-pair losses (P,) of loss ``name`` and per-pair detached metrics (see the module docstring).

    ``policy_*`` and ``ref_*`` are summed log-probs over each sequence's loss tokens; ``*_tokens``
    their loss-token counts (used by ``sigmoid_norm`` only, must be >= 1)."""
    if name not in PREFERENCE_LOSSES:
        raise ValueError(f"unknown preference loss {name!r}; valid: {', '.join(PREFERENCE_LOSSES)}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    fn, normalise = PREFERENCE_LOSSES[name]
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    if normalise:
        if bool((chosen_tokens < 1).any()) or bool((rejected_tokens < 1).any()):
            raise ValueError("sigmoid_norm needs at least one loss token in every sequence")
        chosen_ratio = chosen_ratio / chosen_tokens
        rejected_ratio = rejected_ratio / rejected_tokens
    h = chosen_ratio - rejected_ratio
    losses = fn(h, beta)
    chosen_reward = beta * chosen_ratio.detach()
    rejected_reward = beta * rejected_ratio.detach()
    metrics = {
        "rewards/chosen": chosen_reward,
        "rewards/rejected": rejected_reward,
        "rewards/margin": chosen_reward - rejected_reward,
        "rewards/accuracy": (h.detach() > 0).to(h.dtype),
    }
    return losses, metrics
