"""The training methods' own config sections (SFT, rejection sampling, DPO, the reward model), and the
base every config section shares; `train.config.TrainConfig` composes them (and re-exports them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentrft.pairs import DEFAULT_MARGIN, DEFAULT_PAIRS_PER_TASK


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SFTConfig(_Cfg):
    """Filtered SFT (``method: sft``): mean NLL of the selected trajectories' assistant tokens (algos/sft.py)."""

    batch_size: int = Field(
        default=8,
        ge=1,
        description="trajectories per optimizer step, drawn from the selection as an endless seeded shuffle "
        "(one pass over it per epoch; epochs = steps * batch_size / selected)",
    )
    group_by_prompt: bool = Field(
        default=False,
        description="draw each batch from trajectories whose prompts open alike (the same system prompt and "
        "worked examples: every prompt message but the last), as far as the groups' sizes allow, so a shared-prefix "
        "layout runs that opening once per packed row (train.sft.prompt_groups)",
    )


class RejectionSamplingConfig(_Cfg):
    """Rejection-sampling fine-tuning (``method: rejection_sampling``): rounds of sample -> grade -> keep -> SFT.

    Each round samples ``rollout.group_size`` episodes of ``tasks_per_round`` tasks of ``rollout.split``
    with the current policy, grades them, keeps what ``data``'s filters keep (e.g. ``success_only`` and
    ``best_of_n: 1``: the graded best success per task), then takes ``steps_per_round`` SFT steps of
    ``sft.batch_size`` kept trajectories. Rounds: ``steps / steps_per_round`` (the last may be shorter)."""

    steps_per_round: int = Field(default=4, ge=1, description="SFT steps on each round's kept trajectories")
    tasks_per_round: int = Field(default=16, ge=1, description="tasks sampled per round")


Method = Literal["grpo", "sft", "rejection_sampling", "dpo", "reward_model"]
DATA_METHODS: tuple[Method, ...] = ("sft",)  # learn from recorded trajectories named by `data.source`


class _PairsConfig(_Cfg):
    """Where preference pairs come from and the pairing rule (agentrft.pairs): shared by DPO and the reward model."""

    pairs: str | None = Field(
        default=None,
        description="a TRL conversational pairs file (JSONL: prompt/chosen/rejected), rendered through the "
        "policy's chat template; None: pairs built from the trajectories `data` selects",
    )
    margin: float = Field(
        default=DEFAULT_MARGIN, gt=0.0, description="least reward gap between chosen and rejected (pairing)"
    )
    pairs_per_task: int = Field(
        default=DEFAULT_PAIRS_PER_TASK,
        ge=1,
        description="most pairs per task (pairing): largest gap first, then the least-used trajectories; "
        "1 = best vs worst",
    )
    pairs_per_step: int = Field(
        default=8, ge=1, description="pairs per optimizer step, in a seeded order reshuffled every epoch"
    )


class DPOConfig(_PairsConfig):
    """Direct preference optimisation from pairs (``method: dpo``; see train/data/dpo.py)."""

    loss: Literal["sigmoid", "ipo", "sigmoid_norm"] = Field(
        default="sigmoid",
        description="sigmoid: DPO; ipo: (h - 1/(2 beta))^2; sigmoid_norm: DPO on log-probs divided by their "
        "loss-token counts (algos/dpo.py)",
    )
    beta: float = Field(default=0.1, gt=0.0, description="strength of the tie to the reference (IPO: 1/(2 beta))")


class RewardModelConfig(_PairsConfig):
    """A Bradley–Terry reward model from preference pairs (``method: reward_model``; see train/data/reward_model.py)."""

    heldout_fraction: float = Field(
        default=0.2,
        ge=0.0,
        lt=1.0,
        description="fraction of the tasks whose pairs are held out (never trained on) to measure pairwise "
        "accuracy; which tasks is fixed by a hash of the task id (a pairs file without task_id: of the prompt)",
    )
    heldout_every_steps: int = Field(
        default=0, ge=0, description="held-out accuracy every N steps; it is always measured after the last"
    )
    center_coef: float = Field(
        default=0.01,
        ge=0.0,
        description="c of the centring term c * (r_w + r_l)^2 (keeps scores near 0, so sigmoid(score) reads as a "
        "probability of being preferred); 0 = the plain Bradley-Terry loss",
    )
