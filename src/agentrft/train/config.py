"""Training configuration: one validated pydantic model per component.

Load with `load_config(path, overrides)` from YAML or TOML; `--set a.b=c`
overrides are parsed as YAML scalars (``3`` int, ``1e-5`` float, ``true`` bool,
``[1,2]`` list) and validated with the rest, so an error names the dotted key.
Files are read by `agentrft.inputs` (UTF-8, bounded nesting, no NaN), and an
empty file is refused rather than read as "all defaults".
`check_references(cfg)` then resolves what the config names (environment and
its splits, grader spec, policy) without loading a model, so that a bad config
fails before a run directory is written; for the methods that learn from
recorded trajectories it also runs the selection and checks every selected
trajectory's token record (or renders it). Presets (`PRESETS`) are plain dicts
in `train/presets.py`, validated as a file is. Every option documents itself here.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrft.inputs import InputError, check_value, loads_yaml, read_structured
from agentrft.precision import Precision
from agentrft.rollout.agent_command import AgentCommandConfig
from agentrft.rollout.formats import FormatName
from agentrft.train.data import DataConfig
from agentrft.train.method_config import (  # the methods' own sections, re-exported here
    DATA_METHODS,
    DPOConfig,
    Method,
    RejectionSamplingConfig,
    RewardModelConfig,
    SFTConfig,
    _Cfg,
)
from agentrft.train.presets import PRESETS  # re-exported: `from agentrft.train.config import PRESETS`

if TYPE_CHECKING:
    from agentrft.samplers.distribution import Distribution


class ConfigError(InputError):
    """A bad config file, key or value; the message names the file and the dotted key."""


class PolicyConfig(_Cfg):
    name: str = Field(default="smollm2-135m", description="policy name for agentrft.samplers.load_policy")
    sampler: Literal["engine", "reference"] = Field(
        default="engine",
        description="in-process sampler: the continuous-batching engine, or the reference sampler (one plain "
        "transformers generate() per request: slow, the engine's test oracle)",
    )
    sampler_precision: Precision = Field(
        default="fp32",
        description="the engine's compute: bf16 autocast with bf16 KV (about half the memory and prefill time on a "
        "CPU that multiplies bf16 natively; the trainer's bf16 autocast computes the same function), fp32, or auto "
        "(bf16 on such a CPU, else fp32: elsewhere bf16 is emulated and ~3x slower); bf16 pays off with full "
        "fine-tuning (autocast caches casts of trainable weights only, so LoRA's frozen base is recast every "
        "decode step)",
    )
    sampler_kv_positions: int | Literal["auto"] | None = Field(
        default="auto",
        description="the engine's bound on its batch KV cache (rows x length positions, the shared head once; auto: "
        "the positions 720 MiB holds, `samplers.hf.KV_BUDGET_MIB`, e.g. SmolLM2-135M's 32,768 in bf16 and 16,384 in "
        "fp32 at 22.5 / 45 KiB a position; None: unbounded): requests wait for room rather than grow it; with the "
        "prefix cache, what bounds the sampler's memory on long multi-turn episodes",
    )
    sampler_prefix_cache_tokens: int | Literal["auto"] = Field(
        default="auto",
        description="positions of KV the engine keeps for shared prompt prefixes and finished turns, reused by "
        "later requests that extend them (auto: as many as 720 MiB holds, like sampler_kv_positions); 0 turns "
        "the prefix cache off",
    )
    finetune: Literal["full", "lora"] = Field(default="lora", description="train all weights or a LoRA adapter (peft)")
    lora_r: int = Field(default=16, ge=1)
    lora_alpha: int = Field(default=32, ge=1)
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="recompute each layer in the backward: much less activation memory, ~1/3 more compute",
    )
    freeze_layers: int = Field(
        default=0,
        ge=0,
        description="full fine-tuning: keep the token embeddings (and an lm_head tied to them) and the first N "
        "decoder layers fixed; the backward then stops at layer N, so a step costs about (1 + 2 (L - N) / L) / 3 "
        "of a full one on an L-layer model (forward everywhere, backward above N), with less activation memory. "
        "It learns less per step: SmolLM2-135M imitating 96 level-2 demonstrations in 12 steps reached held-out "
        "pass@1 0.59 with N = 8 or 15 of 30 against 0.78 with nothing frozen (0.81 with only the embeddings)",
    )
    precision: Precision = Field(
        default="auto",
        description="bf16 autocast with fp32 master weights, or fp32; auto = bf16 when the CPU multiplies bf16 "
        "natively (avx512_bf16 or AMX), else fp32 (agentrft.precision)",
    )

    @field_validator("sampler_kv_positions")
    @classmethod
    def _kv_positions(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v < 1:
            raise ValueError(f"must be >= 1, auto or null (unbounded), got {v}")
        return v

    @field_validator("sampler_prefix_cache_tokens")
    @classmethod
    def _prefix_cache_tokens(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError(f"must be >= 0 (0: no prefix cache) or auto, got {v}")
        return v

    @model_validator(mode="after")
    def _freeze_is_full(self) -> PolicyConfig:
        if self.freeze_layers and self.finetune != "full":
            raise ValueError("freeze_layers applies to finetune: full (a LoRA adapter already keeps the base fixed)")
        return self

    def sampler_options(self) -> dict[str, Any]:
        """Keyword arguments of `samplers.policies.load_trainable_policy` for this section (the name and seed apart)."""
        options: dict[str, Any] = {"sampler": self.sampler, "precision": self.sampler_precision}
        if self.sampler == "engine":
            options |= {
                "max_kv_positions": self.sampler_kv_positions,
                "prefix_cache_tokens": self.sampler_prefix_cache_tokens,
            }
        return options


class CurriculumConfig(_Cfg):
    """Tasks drawn across levels (`task.data["level"]`) by the measured pass rate (train/curriculum.py); grpo only."""

    enabled: bool = False
    window: int = Field(default=32, ge=1, description="episodes of a level in its rolling pass rate")
    min_episodes: int = Field(default=16, ge=1, description="episodes of a level before its rate can promote")
    promote_at: float = Field(
        default=0.5, gt=0.0, le=1.0, description="a level whose rolling pass rate reaches this unlocks the next"
    )
    keep_share: float = Field(
        default=0.2,
        ge=0.0,
        lt=1.0,
        description="share of draws spread evenly over the levels already passed (weighting learnability: over "
        "every unlocked level)",
    )
    start_unlocked: int = Field(
        default=1,
        ge=1,
        description="levels unlocked at the start, lowest first (a policy that has imitated every level: all)",
    )
    weighting: Literal["frontier", "learnability"] = Field(
        default="frontier",
        description="level weights: frontier = the newest unlocked level gets 1 - keep_share; learnability = each "
        "unlocked level by p(1-p) of its rolling pass rate p (the GRPO groups with signal), keep_share spread evenly",
    )
    stratified: bool = Field(
        default=False,
        description="each step's draws hold every level its weight's share of them (floor of n x weight, the rest "
        "drawn by the fractions left) instead of n independent draws; a level weighted >= 1/n is in every step",
    )
    mixed_weight: float = Field(
        default=2.0, ge=0.0, description="weight of a task whose last group had some successes, not all (unseen: 1)"
    )
    flat_weight: float = Field(
        default=0.5, ge=0.0, description="weight of a task whose last group all passed or all failed (unseen: 1)"
    )

    @model_validator(mode="after")
    def _window_holds_min(self) -> CurriculumConfig:
        if self.min_episodes > self.window:
            raise ValueError("min_episodes must be <= window (the rolling pass rate holds window episodes)")
        return self


class RolloutConfig(_Cfg):
    env: str = Field(default="finqa-lite:1", description="environment name for agentrft.envs.registry.make_env")
    split: str = Field(default="train", description="task split to train on")
    tasks_per_step: int = Field(default=4, ge=1)
    group_size: int = Field(default=8, ge=1, description="G: samples per task (one GRPO group)")
    temperature: float = Field(
        default=1.0,
        gt=0.0,
        description="sampling temperature; also the temperature of the trained log-probs (one distribution)",
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling; the trainer applies it too")
    max_tokens: int = Field(default=128, ge=1, description="sampled tokens per assistant turn")
    tool_format: FormatName = Field(default="xml", description="how tool calls look in the model's text")
    grader: dict[str, Any] | None = Field(default=None, description="grader spec; None = the environment's default")
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig, description="draw tasks across levels by pass rate (grpo, synchronous)"
    )
    expert_per_group: int = Field(
        default=0,
        ge=0,
        description="guided groups: this many of each group's group_size episodes are the environment's expert "
        "(Environment.expert()) playing the task through the same loop, graded and trained with the policy's "
        "(train/stages.py); 0 = none",
    )


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


class AsyncConfig(_Cfg):
    """Asynchronous RL (train/pipeline.py): rollouts keep going with the newest weights while the trainer updates."""

    max_staleness: int = Field(
        default=0,
        ge=0,
        description="k: no trajectory sampled by weights of version v is used in the update that starts from "
        "version n when n - v > k (producers wait instead); 0 = the synchronous loop",
    )
    max_inflight_groups: int | None = Field(
        default=None,
        ge=1,
        description="groups being played at once (finished ones may still queue up to the staleness bound); "
        "None: rollout.tasks_per_step, the synchronous loop's batch (more oversubscribes an in-process sampler)",
    )


class RayConfig(_Cfg):
    """Rollout workers as Ray actors (train/ray_rollout.py; ``pip install agentrft[ray]``)."""

    enabled: bool = Field(default=False, description="play groups on Ray actors (`agentrft train --ray`)")
    address: str | None = Field(
        default=None, description="a Ray cluster to join (implies enabled); None: ray.init() starts a local one"
    )
    workers: int = Field(default=2, ge=1, description="rollout worker actors, each with its own sampler")
    worker_cpus: float = Field(default=1.0, gt=0.0, description="CPUs each worker reserves (and its torch threads)")

    @property
    def on(self) -> bool:
        return self.enabled or self.address is not None


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


class OptimizerConfig(_Cfg):
    lr: float = Field(default=1e-5, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(default=0.0, ge=0.0)
    grad_clip: float = Field(default=1.0, gt=0.0)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    micro_batch_tokens: int = Field(default=4096, ge=1, description="token budget (rows x longest row) per micro-batch")
    logprob_chunk: int = Field(default=1024, ge=1, description="tokens per lm_head chunk")
    shared_prefix: bool = Field(
        default=True,
        description="run each common token prefix (a group's prompt) once per micro-batch, as a prefix tree with a "
        "4D attention mask; exact (same log-probs, loss and gradients up to float rounding)",
    )
    shared_prefix_row_tokens: int = Field(
        default=2048,
        ge=1,
        description="most packed tokens per prefix-tree row; attention cost grows with its square, and a group "
        "that does not fit is split (each part recomputes its prefix, still exact)",
    )
    shared_prefix_layout: Literal["tree", "segments"] = Field(
        default="tree",
        description="tree: a prefix tree with a dense 4D mask (shares every common prefix, attention over the whole "
        "row); segments: a row's common prefix once, then each sequence's suffix, attended per segment without a "
        "dense mask (train/segment_attention.py), for long episodes sharing a prompt; both exact. GRPO, SFT and "
        "rejection sampling; DPO and reward models keep the tree (a pair is one unit of a row)",
    )
    context_grad: Literal["full", "stop"] = Field(
        default="full",
        description="full: the exact gradient; stop: the tokens no loss trains (prompt, tool outputs) run forward "
        "once without autograd and the trained tokens attend to their keys and values as constants "
        "(train/context_grad.py): the same loss, a gradient that skips how the context is encoded, a fraction of "
        "the update's compute on long tool outputs. Needs shared_prefix with the segments layout. Measured on "
        "the agentic recipe's first imitation pass (2-core AMD EPYC): 21 min against ~46 exact (a level-3 batch "
        "41-50 s vs 98-105 s, 4.3 vs 12.9 GiB), but held-out pass@1 level 2 0.30 and level 3 0.03, where the exact "
        "pass reached 0.78 and 0.44 (runs/agentic3, unpaired): the routine is learned, the figures are copied from "
        "the worked example instead of the page; the agentic presets keep full",
    )

    @model_validator(mode="after")
    def _context_grad_layout(self) -> OptimizerConfig:
        if self.context_grad == "stop" and not (self.shared_prefix and self.shared_prefix_layout == "segments"):
            raise ValueError(
                "optimizer.context_grad: stop needs optimizer.shared_prefix true and shared_prefix_layout segments"
            )
        return self


class EvalConfig(_Cfg):
    every_steps: int = Field(default=0, ge=0, description="0 = no periodic eval")
    split: str = Field(default="held-out", description="held-out task split (finqa-lite: held-out or ood)")
    num_tasks: int = Field(default=16, ge=1)
    samples_per_task: int = Field(default=1, ge=1)
    temperature: float = Field(default=0.0, ge=0.0)


class CheckpointConfig(_Cfg):
    every_steps: int = Field(default=1, ge=0, description="0 = only at the end")
    keep_last: int = Field(default=2, ge=1)


class LoggingConfig(_Cfg):
    tensorboard: bool = True
    wandb: bool = False
    mlflow: bool = False


class TrainConfig(_Cfg):
    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    method: Method = Field(
        default="grpo",
        description="grpo: online RL (rollout, algorithm); sft: filtered SFT on recorded trajectories (data, sft); "
        "rejection_sampling: rounds of sampling with the current policy, keeping the graded best (data's filters) "
        "and SFT on them (rejection_sampling, rollout, sft); dpo: preference pairs (dpo, and data or dpo.pairs); "
        "reward_model: a Bradley-Terry reward model from preference pairs (reward_model, and data or "
        "reward_model.pairs). Every method runs on the one training core (train/session.py)",
    )
    seed: int = Field(default=0, ge=0, lt=2**32, description="seeds python, numpy, torch and the sampler")
    steps: int = Field(default=10, ge=1)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    data: DataConfig = Field(default_factory=DataConfig, description="recorded trajectories (sft, dpo, reward_model)")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="sft and rejection_sampling")
    rejection_sampling: RejectionSamplingConfig = Field(default_factory=RejectionSamplingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    agent: AgentCommandConfig | None = Field(
        default=None,
        description="an agent program to train and evaluate instead of the built-in agent loop: one run of "
        "agent.command per episode, talking to a session of an in-process OpenAI-compatible server "
        "(rollout/agent_command.py); the environment gives the tasks and the grader",
    )
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    async_: AsyncConfig = Field(
        default_factory=AsyncConfig, alias="async", description="asynchronous rollouts with a staleness bound (grpo)"
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="rollout workers on Ray (grpo)")
    dpo: DPOConfig = Field(default_factory=DPOConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="before")
    @classmethod
    def _one_distribution(cls, data: Any) -> Any:
        """The trained log-probs are those of the rollout's sampling distribution; there is no second
        temperature to set. Configs written before that rule are refused when they disagree."""
        algo = data.get("algorithm") if isinstance(data, dict) else None
        if isinstance(algo, dict) and "logprob_temperature" in algo:
            rollout = data.get("rollout") if isinstance(data.get("rollout"), dict) else {}
            t = rollout.get("temperature", RolloutConfig.model_fields["temperature"].default)
            if algo["logprob_temperature"] != t:
                raise ValueError(
                    f"algorithm.logprob_temperature={algo['logprob_temperature']} differs from rollout.temperature="
                    f"{t}: the trainer must train the distribution the sampler drew from; remove "
                    "algorithm.logprob_temperature (the training temperature is rollout.temperature)"
                )
            data = {**data, "algorithm": {k: v for k, v in algo.items() if k != "logprob_temperature"}}
        return data

    @model_validator(mode="after")
    def _method_data(self) -> TrainConfig:
        if self.optimizer.context_grad == "stop" and self.method in ("dpo", "reward_model"):
            raise ValueError(f"optimizer.context_grad: stop is for grpo, sft and rejection_sampling, not {self.method}")
        if self.async_.max_staleness and self.method != "grpo":
            raise ValueError(f"async.max_staleness: asynchronous rollouts are for method grpo, not {self.method}")
        if self.ray.on and self.method != "grpo":
            raise ValueError(f"ray: rollout workers on Ray are for method grpo, not {self.method}")
        if self.rollout.curriculum.enabled:
            if self.method != "grpo":
                raise ValueError(f"rollout.curriculum: the curriculum draws GRPO's tasks, not {self.method}'s")
            if self.async_.max_staleness or self.ray.on:
                raise ValueError(
                    "rollout.curriculum: not available with asynchronous rollouts yet (async.max_staleness, ray): "
                    "the pipeline replays a draw by its index, and a curriculum's draw depends on the pass rates "
                    "measured when it was made"
                )
        k = self.rollout.expert_per_group
        if k:
            if self.method != "grpo":
                raise ValueError(f"rollout.expert_per_group: guided groups are GRPO's, not {self.method}'s")
            if self.async_.max_staleness or self.ray.on or self.agent is not None:
                raise ValueError(
                    "rollout.expert_per_group: guided groups are for the synchronous in-process loop (no "
                    "async.max_staleness, ray or agent): the expert's tokens carry no sampler log-probs to correct by"
                )
            if self.off_policy_correction() != "none":
                raise ValueError(
                    "rollout.expert_per_group: an off-policy correction weighs tokens by their sampler log-probs, "
                    "and the expert's have none (algorithm.off_policy.correction: none or auto)"
                )
            if k >= self.rollout.group_size:
                raise ValueError(
                    f"rollout.expert_per_group: {k} of a group of {self.rollout.group_size} leaves no policy episode"
                )
        if self.method == "rejection_sampling":
            if self.data.source is not None:
                raise ValueError(
                    "data.source: rejection_sampling samples its own trajectories; data's filters choose which "
                    "to keep (leave data.source unset, or use method: sft)"
                )
            d = self.data
            if not (d.success_only or d.min_reward is not None or d.best_of_n is not None):
                raise ValueError(
                    "data: rejection_sampling keeps the graded best of each round; set data.success_only, "
                    "data.min_reward or data.best_of_n"
                )
        return self

    def off_policy_correction(self) -> Literal["none", "tis", "mis"]:
        """``algorithm.off_policy.correction`` with auto resolved: tis when asynchronous, else none."""
        c = self.algorithm.off_policy.correction
        if c == "auto":
            return "tis" if self.async_.max_staleness else "none"
        return c

    def sampling_distribution(self) -> Distribution:
        """The distribution the rollout samples from and the trainer trains (`samplers.distribution`)."""
        from agentrft.samplers.distribution import Distribution

        return Distribution(temperature=self.rollout.temperature, top_p=self.rollout.top_p)

    def save(self, path: Path) -> None:
        path.write_text(yaml.safe_dump(json.loads(self.model_dump_json()), sort_keys=False))


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {p!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``"a.b=c"`` -> ``("a.b", parsed c)``; the value is parsed as a YAML scalar or list."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. optimizer.lr=1e-5")
    try:
        value = loads_yaml(raw) if raw.strip() else ""
    except InputError as exc:
        raise ConfigError(f"--set {key}: cannot use value {raw[:80]!r}: {exc}") from None
    if isinstance(value, str) and value.strip():  # YAML reads 1e-5 as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    return key.strip(), value


def _read(path: Path) -> dict[str, Any]:
    try:
        data = read_structured(path, default=".yaml")
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    if data is None or data == {}:
        raise ConfigError(f"{path}: empty config (set at least one option, or train a preset: {', '.join(PRESETS)})")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def build_config(base: dict[str, Any], overrides: Sequence[str] = (), source: str = "config") -> TrainConfig:
    """Validate ``base`` with ``KEY=VALUE`` overrides applied (``base`` is not mutated)."""
    data = copy.deepcopy(base)
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    try:
        check_value(data, source)
    except InputError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        msg = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{source}: {key + ': ' if key else ''}{msg}{more}") from None


def load_config(path_or_preset: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """A config from a YAML/TOML file or a preset name, with ``KEY=VALUE`` overrides applied."""
    name = str(path_or_preset)
    if name in PRESETS and not Path(name).exists():
        return build_config(PRESETS[name], list(overrides), source=f"preset {name}")
    path = Path(name)
    if not path.exists():
        raise ConfigError(f"{path}: no such config file (presets: {', '.join(PRESETS)})")
    return build_config(_read(path), list(overrides), source=str(path))


def check_references(cfg: TrainConfig, source: str = "config") -> None:
    """Resolve what `cfg` names without loading a model: the environment (its tasks are read, so a
    bad dataset fails here), the train and eval splits, the grader spec and the policy name; for
    ``sft`` the data selection and every selected trajectory (`_check_data`).
    ConfigError names the key. Training calls nothing else that can refuse the config."""
    from agentrft.envs.registry import make_env
    from agentrft.graders import load_grader
    from agentrft.samplers.policies import POLICY_NAMES, is_in_process

    def refuse(key: str, why: str) -> ConfigError:
        return ConfigError(f"{source}: {key}: {why}")

    if not is_in_process(cfg.policy.name):
        trainable = [n for n in POLICY_NAMES if is_in_process(n.replace("PATH_OR_ID", "x"))]
        raise refuse("policy.name", f"{cfg.policy.name!r} cannot be trained in process; valid: {', '.join(trainable)}")
    try:
        env = make_env(cfg.rollout.env)
    except InputError as exc:
        raise refuse("rollout.env", str(exc)) from None
    splits = [("rollout.split", cfg.rollout.split)] + ([("eval.split", cfg.eval.split)] if cfg.eval.every_steps else [])
    for key, split in splits:
        try:
            tasks = env.tasks(split)
        except InputError as exc:
            raise refuse(key, str(exc)) from None
        if not tasks:
            raise refuse(key, f"environment {cfg.rollout.env!r} has no tasks in split {split!r}")
    try:
        load_grader(cfg.rollout.grader or env.grader_spec())
    except InputError as exc:
        raise refuse("rollout.grader", str(exc)) from None
    if cfg.agent is not None:
        if cfg.method != "grpo":
            raise refuse("agent", f"agent.command runs episodes for method grpo, not {cfg.method}")
        if (why := cfg.agent.missing_program()) is not None:
            raise refuse("agent.command", why)
    if cfg.method in DATA_METHODS:
        _check_data(cfg, env.tool_schemas(), source)


def _check_data(cfg: TrainConfig, tool_schemas: list[dict[str, Any]], source: str) -> None:
    """The selection is not empty and every selected trajectory can be learned from: its token record fits its
    messages, or (none recorded) the policy's chat template renders it. Loads the tokenizer only to render."""
    from agentrft.samplers.chat_template import TokenizerRenderer
    from agentrft.samplers.policies import PolicyError, load_tokenizer
    from agentrft.train.data import select_trajectories
    from agentrft.train.records import learnable_records

    if cfg.data.source is None:
        raise ConfigError(
            f"{source}: data.source: method {cfg.method} learns from recorded trajectories; name a store (.db) "
            "or a trajectory export (.jsonl, .parquet)"
        )
    try:
        trajs, _ = select_trajectories(cfg.data)
        renderer, vocab = None, None
        if any(t.tokens is None for t in trajs):
            try:
                tokenizer = load_tokenizer(cfg.policy.name)
            except PolicyError as exc:
                raise ConfigError(f"{source}: policy.name: {exc}") from None
            renderer, vocab = TokenizerRenderer(tokenizer), len(tokenizer)
        learnable_records(
            trajs,
            renderer=renderer,
            tool_format=cfg.rollout.tool_format,
            tool_schemas=tool_schemas,
            vocab_size=vocab,
        )
    except ConfigError:
        raise
    except InputError as exc:
        raise ConfigError(f"{source}: {exc}") from None
