"""Bradley–Terry reward-model loss (Ouyang et al. 2022, InstructGPT §3.5; the pairwise
form of Bradley & Terry 1952): ``P(y_w ≻ y_l | x) = σ(r(x, y_w) − r(x, y_l))``, trained by
maximum likelihood, ``loss = −log σ(r_w − r_l)``.

Departures from the paper: one comparison per pair (InstructGPT batches all K-choose-2
comparisons of one prompt together; here a prompt with several pairs gives several rows,
and the packing runs the prompt once anyway); an optional centring term
``c · (r_w + r_l)²`` (Eisenstein et al. 2023, TRL's ``center_rewards_coefficient``): the BT
likelihood does not see a constant added to every score, and the term pins that constant
near 0 so that ``σ(r)`` (what the ``reward_model`` grader returns) reads as "more likely
preferred than not" when above 1/2. ``c = 0`` is the plain BT loss.

Per-pair losses and metrics are returned; aggregating them (the mean over the step's
pairs, a global count passed by the caller) is the caller's.

Shape legend: P = number of preference pairs; every input and output is (P,).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def pairwise_accuracy(chosen: Tensor, rejected: Tensor) -> Tensor:
    """(P,) 1 where the chosen side scores higher, 0 where lower, 1/2 on a tie (a coin's expected accuracy)."""
    diff = chosen - rejected
    return (diff > 0).to(chosen.dtype) + 0.5 * (diff == 0).to(chosen.dtype)


def bradley_terry_loss(
    chosen: Tensor, rejected: Tensor, *, center_coef: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-pair ``−log σ(r_w − r_l) + center_coef · (r_w + r_l)²`` (P,) and detached per-pair metrics:
    ``rm/accuracy`` (`pairwise_accuracy`), ``rm/margin`` (r_w − r_l), ``rm/chosen_score``, ``rm/rejected_score``.
    ``chosen``/``rejected`` are the scalar scores r(x, y) of each pair's two sides."""
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(
            f"chosen and rejected must both be (P,), got {tuple(chosen.shape)} and {tuple(rejected.shape)}"
        )
    if center_coef < 0:
        raise ValueError(f"center_coef must be >= 0, got {center_coef}")
    diff = chosen - rejected
    losses = -F.logsigmoid(diff)
    if center_coef > 0:
        losses = losses + center_coef * (chosen + rejected) ** 2
    with torch.no_grad():
        metrics = {
            "rm/accuracy": pairwise_accuracy(chosen, rejected),
            "rm/margin": diff.detach(),
            "rm/chosen_score": chosen.detach(),
            "rm/rejected_score": rejected.detach(),
        }
    return losses, metrics
