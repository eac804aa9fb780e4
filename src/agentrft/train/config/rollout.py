"""The rollout's sections of the training config: what is sampled (`RolloutConfig`), how tasks are drawn
across levels (`CurriculumConfig`), asynchronous rollouts (`AsyncConfig`) and Ray workers (`RayConfig`).
Collected into `TrainConfig` by `train/config/__init__.py`, which loads and validates the whole."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from agentrft.rollout.formats import FormatName
from agentrft.train.config.method import _Cfg


class CurriculumConfig(_Cfg):
    """Tasks drawn across levels (`task.data["level"]`) by the measured pass rate (train/rl/curriculum.py); grpo only."""

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


class BranchConfig(_Cfg):
    """Train from branches of recorded episodes (train/rl/branches.py): each step's groups are K continuations of
    the current policy from turn T of stored episodes (tool results replayed from the record), not fresh
    episodes from the prompt."""

    run: str = Field(description="the stored run (id or name) whose episodes are the parents")
    db: str = Field(default="agentrft.db", description="the store holding that run (the CLI's default store)")
    turn: int | str = Field(
        default="after_tool_error",
        description="where to branch: a turn index, the last sampled turn, the turn after the first tool call "
        "that returned an error (where a policy has to recover), or `after_tool:NAME`, the turn after the first "
        "call of tool NAME that returned without error (e.g. after_tool:open: the policy continues from the "
        "document it read); parents without that turn are left out",
    )
    failed_only: bool = Field(default=True, description="branch only from parents whose grade was not a success")

    @field_validator("turn")
    @classmethod
    def _known_turn(cls, v: int | str) -> int | str:
        if isinstance(v, int) or v in ("last", "after_tool_error") or re.fullmatch(r"after_tool:[\w.\-]+", v):
            return v
        if re.fullmatch(r"-?\d+", v):  # a quoted index ("2" in YAML, JSON or TOML) is the index
            return int(v)
        raise ValueError(f"{v!r} is not a turn index, 'last', 'after_tool_error' or 'after_tool:NAME'")


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
    lockstep: bool = Field(
        default=True,
        description="episodes admitted in order and their samples sent in waves (rollout/lockstep.py): the same "
        "seed samples the same tokens on an idle or a busy machine; false lets each request join the running "
        "batch as it arrives (no turn waits for another episode's tools; not reproducible under load)",
    )
    grader: dict[str, Any] | None = Field(default=None, description="grader spec; None = the environment's default")
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig, description="draw tasks across levels by pass rate (grpo, synchronous)"
    )
    expert_per_group: int = Field(
        default=0,
        ge=0,
        description="guided groups: this many of each group's group_size episodes are the environment's expert "
        "(Environment.expert()) playing the task through the same loop, graded and trained with the policy's "
        "(train/rl/stages.py); 0 = none",
    )
    branch: BranchConfig | None = Field(
        default=None,
        description="train on branches of a stored run's episodes from a chosen turn (train/rl/branches.py) "
        "instead of episodes from the prompt; None = fresh episodes",
    )


class AsyncConfig(_Cfg):
    """Asynchronous RL (train/rl/pipeline.py): rollouts keep going with the newest weights while the trainer updates."""

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
    """Rollout workers as Ray actors (train/rl/ray_rollout.py; ``pip install agentrft[ray]``)."""

    enabled: bool = Field(default=False, description="play groups on Ray actors (`agentrft train --ray`)")
    address: str | None = Field(
        default=None, description="a Ray cluster to join (implies enabled); None: ray.init() starts a local one"
    )
    workers: int = Field(default=2, ge=1, description="rollout worker actors, each with its own sampler")
    worker_cpus: float = Field(default=1.0, gt=0.0, description="CPUs each worker reserves (and its torch threads)")

    @property
    def on(self) -> bool:
        return self.enabled or self.address is not None
