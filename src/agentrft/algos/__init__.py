"""Pure tensor functions of RL fine-tuning: advantages, per-token losses, aggregation, shaping, off-policy correction,
preference losses, SFT.

Every function is a function of its tensor arguments (no hidden state, inputs never
mutated) and returns ``(result, metrics)`` where that makes sense; the caller runs
the model and does the logging.
"""

from agentrft.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    broadcast_turn_advantages,
    dr_grpo,
    get_advantage_estimator,
    grpo,
    rloo,
    turn_level,
)
from agentrft.algos.aggregation import aggregate, constant, masked_mean, seq_mean_token_mean, token_mean
from agentrft.algos.dpo import PREFERENCE_LOSSES, preference_loss
from agentrft.algos.dynamic_sampling import filter_groups, is_zero_signal
from agentrft.algos.losses import clipped_pg_loss, k3_kl
from agentrft.algos.offpolicy import CORRECTIONS, behaviour_weights, decoupled_ppo_loss, staleness_histogram
from agentrft.algos.sft import nll_loss
from agentrft.algos.shaping import overlong_penalty, shape_rewards

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "CORRECTIONS",
    "PREFERENCE_LOSSES",
    "aggregate",
    "behaviour_weights",
    "broadcast_turn_advantages",
    "clipped_pg_loss",
    "constant",
    "decoupled_ppo_loss",
    "dr_grpo",
    "filter_groups",
    "get_advantage_estimator",
    "grpo",
    "is_zero_signal",
    "k3_kl",
    "masked_mean",
    "nll_loss",
    "overlong_penalty",
    "preference_loss",
    "rloo",
    "seq_mean_token_mean",
    "shape_rewards",
    "staleness_histogram",
    "token_mean",
    "turn_level",
]
