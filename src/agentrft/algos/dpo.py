"""DPO loss (Rafailov et al., arXiv 2305.18290), eq. 7.

``loss = -log sigmoid(beta * [(logpi(y_w) - logpi_ref(y_w)) - (logpi(y_l) - logpi_ref(y_l))])``

Inputs are summed sequence log-probs of the chosen (w) and rejected (l) responses.
Departure: optional conservative label smoothing (cDPO, Mitchell 2023):
``(1 - s) * loss(w, l) + s * loss(l, w)``; s = 0 is the paper's loss.

Shape legend: P = number of preference pairs; every input is (P,).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Mean DPO loss over pairs and detached metrics (implicit rewards, accuracy, margin)."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_reward = beta * (policy_chosen - ref_chosen)
    rejected_reward = beta * (policy_rejected - ref_rejected)
    logits = chosen_reward - rejected_reward
    losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    metrics = {
        "dpo_chosen_reward": chosen_reward.detach().mean(),
        "dpo_rejected_reward": rejected_reward.detach().mean(),
        "dpo_accuracy": (logits.detach() > 0).float().mean(),
        "dpo_margin": logits.detach().mean(),
    }
    return losses.mean(), metrics
