"""The algorithm's section of the training config (`AlgorithmConfig`): advantages, clipping, aggregation, KL,
the off-policy correction, DAPO's overlong shaping and dynamic sampling. Formulas: SPECS.md, `algos/`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from agentrft.train.config.method import _Cfg


class OverlongConfig(_Cfg):
    enabled: bool = False
    max_len: int = Field(default=512, ge=1, description="L_max: sampled tokens per episode before the full penalty")
    cache_len: int = Field(default=128, ge=0, description="L_cache: width of the linear penalty ramp")
    penalty: float = Field(default=1.0, ge=0.0)

    @model_validator(mode="after")
    def _ramp_fits(self) -> OverlongConfig:
        if self.cache_len > self.max_len:
            raise ValueError("cache_len must be <= max_len")
        return self


class DynamicSamplingConfig(_Cfg):
    enabled: bool = False
    max_rounds: int = Field(default=3, ge=1, description="sampling rounds per step before training on what there is")


class OffPolicyConfig(_Cfg):
    """The behaviour importance weight w = exp(logp_proximal - logp_sampler) of the decoupled PPO objective."""

    correction: Literal["auto", "none", "tis", "mis"] = Field(
        default="auto",
        description="none: weight 1; tis: min(w, cap) (truncated IS); mis: w inside [low, high], tokens outside "
        "masked (IcePop-style); auto: tis when async.max_staleness > 0, else none",
    )
    cap: float = Field(default=2.0, gt=0.0, description="tis: the cap C")
    low: float = Field(default=0.5, ge=0.0, le=1.0, description="mis: tokens with w < low are masked")
    high: float = Field(default=2.0, ge=1.0, description="mis: tokens with w > high are masked")


class AlgorithmConfig(_Cfg):
    @model_validator(mode="before")
    @classmethod
    def _is_cap_is_tis(cls, data: Any) -> Any:
        """``is_cap: C`` (older configs) is ``off_policy: {correction: tis, cap: C}``."""
        if isinstance(data, dict) and "is_cap" in data:
            data = dict(data)
            cap = data.pop("is_cap")
            if cap is not None:
                data["off_policy"] = {**dict(data.get("off_policy") or {}), "correction": "tis", "cap": cap}
        return data

    advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    adv_eps: float = Field(default=1e-6, gt=0.0)
    turn_level: bool = Field(default=False, description="add group-normalised turn rewards (Grade.turn_rewards)")
    turn_weight: float = 1.0
    eps_low: float = Field(default=0.2, ge=0.0)
    eps_high: float = Field(default=0.28, ge=0.0)
    aggregation: Literal["token_mean", "seq_mean_token_mean", "constant"] = "token_mean"
    constant_max_tokens: int = Field(default=512, ge=1, description="L of the Dr. GRPO constant normaliser (G * L)")
    kl_coef: float = Field(default=0.0, ge=0.0, description="k3 KL to the initial policy; 0 = no reference model")
    off_policy: OffPolicyConfig = Field(
        default_factory=lambda: OffPolicyConfig(),
        description="correction for tokens the sampler drew with older weights (algos/offpolicy.py)",
    )
    updates_per_batch: int = Field(default=1, ge=1, description="optimizer steps on each rollout batch (PPO epochs)")
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
