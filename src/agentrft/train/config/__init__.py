"""Training configuration: one validated pydantic model per component.

Load with `load_config(path, overrides)` from YAML or TOML; `--set a.b=c`
overrides are parsed as YAML scalars (``3`` int, ``1e-5`` float, ``true`` bool,
``[1,2]`` list) and validated with the rest, so an error names the dotted key.
Files are read by `agentrft.inputs` (UTF-8, bounded nesting, no NaN), and an
empty file is refused rather than read as "all defaults".
`train/config_check.check_references(cfg)` then resolves what the config names
without loading a model. The rollout's sections live in `train/config/rollout.py`,
the algorithm's in `train/config/algorithm.py`, the methods' in
`train/config/method.py`; presets (`PRESETS`) are plain dicts in
`train/config/presets.py`, validated as a file is. Every option documents itself.
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

from agentrft.inputs import InputError, check_value, first_problem, loads_yaml, read_structured
from agentrft.precision import Precision
from agentrft.rollout.agent_command import AgentCommandConfig
from agentrft.train.config.algorithm import AlgorithmConfig
from agentrft.train.config.method import (  # the methods' own sections, re-exported here
    DPOConfig,
    Method,
    RejectionSamplingConfig,
    RewardModelConfig,
    SFTConfig,
    _Cfg,
)
from agentrft.train.config.presets import PRESETS  # re-exported: `from agentrft.train.config import PRESETS`
from agentrft.train.config.rollout import AsyncConfig, RayConfig, RolloutConfig
from agentrft.train.data import DataConfig
from agentrft.train.rl.tripwires import TripwiresConfig

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


# tokens per lm_head chunk (`optimizer.logprob_chunk`, and the log-prob functions' default, train/core/logprobs.py)
LOGPROB_CHUNK = 256


class OptimizerConfig(_Cfg):
    lr: float = Field(default=1e-5, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(default=0.0, ge=0.0)
    grad_clip: float = Field(default=1.0, gt=0.0)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    weights: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description="fp32: fp32 weights, gradients and AdamW states (bf16 autocast computes); bf16: the trained "
        "weights, their gradients and AdamW's states all in bf16, each update rounded stochastically so steps "
        "smaller than bf16's spacing are not lost (train/core/bf16_adamw.py): about half "
        "the training memory; full fine-tune with bf16 compute only",
    )
    micro_batch_tokens: int = Field(default=4096, ge=1, description="token budget (rows x longest row) per micro-batch")
    logprob_chunk: int = Field(
        default=LOGPROB_CHUNK,
        ge=1,
        description="tokens per lm_head chunk: its fp32 logits, softmax and entropy are the update's largest "
        "temporaries (about 5 x chunk x vocabulary x 4 bytes: 250 MB at 256 tokens and a 49k vocabulary)",
    )
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
        "dense mask (train/core/segment_attention.py), for long episodes sharing a prompt; both exact. GRPO, SFT and "
        "rejection sampling; DPO and reward models keep the tree (a pair is one unit of a row)",
    )
    context_grad: Literal["full", "stop"] = Field(
        default="full",
        description="full: the exact gradient; stop: the tokens no loss trains (prompt, tool outputs) run forward "
        "once without autograd and the trained tokens attend to their keys and values as constants "
        "(train/core/context_grad.py): the same loss, a gradient that skips how the context is encoded, a fraction of "
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
        "reward_model.pairs). Every method runs on the one training core (train/core/session.py)",
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
    tripwires: TripwiresConfig = Field(default_factory=TripwiresConfig)

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
        if self.optimizer.weights == "bf16":
            if self.policy.finetune != "full":
                raise ValueError("optimizer.weights: bf16 keeps the trained weights in bf16; for policy.finetune full")
            if self.policy.precision == "fp32" or self.policy.sampler_precision == "fp32":
                raise ValueError(
                    "optimizer.weights: bf16 weights compute in bf16: set policy.precision and "
                    "policy.sampler_precision to bf16 or auto"
                )
        if self.optimizer.context_grad == "stop" and self.method in ("dpo", "reward_model"):
            raise ValueError(f"optimizer.context_grad: stop is for grpo, sft and rejection_sampling, not {self.method}")
        if self.method == "grpo" and self.rollout.group_size < 2:
            raise ValueError(
                "rollout.group_size: GRPO compares each episode with its group's others; a group of 1 carries no "
                "signal (set 2 or more)"
            )
        if self.tripwires.check_grader is not None and not self.eval.every_steps:
            raise ValueError("tripwires.check_grader: it is scored at the periodic evals; set eval.every_steps")
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
        if self.rollout.branch is not None:
            if self.method != "grpo":
                raise ValueError(f"rollout.branch: branched groups are GRPO's, not {self.method}'s")
            if self.async_.max_staleness or self.ray.on or self.agent is not None:
                raise ValueError(
                    "rollout.branch: branched groups are played by the synchronous in-process loop (no "
                    "async.max_staleness, ray or agent): a branch continues a token record in the agent loop"
                )
            if k or self.rollout.curriculum.enabled:
                raise ValueError(
                    "rollout.branch: the parents choose the tasks; no rollout.expert_per_group or curriculum with it"
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
        p = first_problem(exc)
        raise ConfigError(f"{source}: {p.field + ': ' if p.field else ''}{p.message}{p.more}") from None


def load_config(path_or_preset: str | Path, overrides: Sequence[str] = ()) -> TrainConfig:
    """A config from a YAML/TOML file or a preset name, with ``KEY=VALUE`` overrides applied."""
    name = str(path_or_preset)
    if name in PRESETS and not Path(name).exists():
        return build_config(PRESETS[name], list(overrides), source=f"preset {name}")
    path = Path(name)
    if not path.exists():
        raise ConfigError(f"{path}: no such config file (presets: {', '.join(PRESETS)})")
    return build_config(_read(path), list(overrides), source=str(path))
