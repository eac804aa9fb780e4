"""The agentic recipe's settings (`AgenticSettings`, ``--set recipe.KEY=VALUE``) and its stages' training
configs (`agentic_configs`: presets ``agentic-imitation``, ``agentic-imitation-late`` and ``agentic-rl`` on the
trained prompt, with ``imitation.`` / ``late.`` / ``rl.`` overrides), all checked before any model loads. The
recipe itself, which runs them, is `agentrft.recipes.agentic`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrft.envs.finqa.shots import shots_of, with_shots
from agentrft.inputs import first_problem
from agentrft.train.config.presets import AGENTIC_DEMO_TASKS as DEMO_TASKS
from agentrft.train.config.presets import AGENTIC_LATE_LEVELS as LATE_LEVELS
from agentrft.train.config.presets import AGENTIC_LATE_REPLAY as LATE_REPLAY
from agentrft.train.config.presets import split_passes


class AgenticSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    quick: bool = False
    levels: list[int] = Field(default_factory=lambda: [2, 3, 4], description="held-out levels evaluated")
    eval_tasks: int = Field(default=32, ge=1, description="held-out tasks of each level per eval")
    eval_samples: int = Field(default=2, ge=1, description="samples per task")
    eval_temperature: float = Field(default=0.7, ge=0.0)
    ood: bool = Field(default=True, description="also evaluate the ood templates before and after")
    ood_tasks: int = Field(default=16, ge=1, description="ood tasks of each level per eval")
    eval_after_imitation: bool = Field(default=True, description="evaluate between imitation and RL")
    demo_tasks: int | dict[int, int] = Field(
        default_factory=lambda: dict(DEMO_TASKS),
        description="oracle demonstrations of the training split: per level, or one count for every level",
    )
    late_levels: list[int] = Field(
        default_factory=lambda: list(LATE_LEVELS),
        description="levels imitated in a second pass, after the others are (empty: one pass over every level)",
    )
    late_replay: int = Field(
        default=LATE_REPLAY,
        ge=0,
        description="demonstrations of each first-pass level (the first N of its own) replayed in the late pass, "
        "so the late levels' pattern does not overwrite theirs; the late pass then takes one pass over both",
    )
    trained_shots: int | str | None = Field(
        default=0,
        description="worked examples per level in the prompts of everything after the baseline (demonstrations, "
        "imitation, RL, later evals): 0 = zero-shot, null = the environment's own, as the baseline has, or per level "
        "as finqa-lite's shots option writes it ('0,4:1': one at level 4 only). The base model needs the worked "
        "example to attempt a task; a trained policy does not, and without it a level-3/4 episode is ~45 % shorter "
        "in every update and every sampled turn",
    )
    baseline_trained_prompt: bool = Field(
        default=True,
        description="also evaluate the base policy on the trained prompt (runs baseline-trained-prompt and, with "
        "ood, baseline-trained-prompt-ood) when it differs from the baseline's, so a gain is not the prompt's",
    )

    @field_validator("demo_tasks")
    @classmethod
    def _counts(cls, value: int | dict[int, int]) -> int | dict[int, int]:
        counts = value.values() if isinstance(value, dict) else [value]
        if min(counts, default=0) < 1 or (isinstance(value, dict) and not set(value) <= set(range(1, 5))):
            raise ValueError(f"demo_tasks: at least 1 per level (levels 1-4), got {value}")
        return value

    @field_validator("trained_shots")
    @classmethod
    def _shots(cls, value: int | str | None) -> int | str | None:
        from agentrft.envs.finqa.shots import parse_shots
        from agentrft.inputs import InputError

        try:
            if value is not None:
                parse_shots(str(value))  # the spec's own grammar: N, or [N,]LEVEL:N pairs
        except InputError as err:
            raise ValueError(f"trained_shots: {err}") from None
        return value

    @field_validator("late_levels")
    @classmethod
    def _late(cls, value: list[int]) -> list[int]:
        if not set(value) <= set(range(1, 5)):
            raise ValueError(f"late_levels: levels 1-4, got {value}")
        if set(value) == set(range(1, 5)):
            raise ValueError("late_levels: the first pass needs at least one level that is not late")
        return sorted(set(value))

    def demo_counts(self) -> tuple[dict[int, int], dict[int, int]]:
        """Demonstrations per level of the first imitation pass and of the late one (empty: no second pass)."""
        counts = self.demo_tasks if isinstance(self.demo_tasks, dict) else dict.fromkeys(range(1, 5), self.demo_tasks)
        return split_passes(counts, self.late_levels, self.late_replay)

    def with_overrides(self, items: list[str]) -> AgenticSettings:
        """These settings with ``recipe.KEY=VALUE`` items applied (VALUE read as every ``--set`` value is,
        `train.config.parse_override`); an unknown key or a bad value raises ConfigError naming the item."""
        from agentrft.train.config import ConfigError, parse_override

        values = self.model_dump()
        for item in items:
            key, value = parse_override(item.removeprefix("recipe."))
            if key not in type(self).model_fields:
                known = ", ".join(type(self).model_fields)
                raise ConfigError(f"--set {item!r}: expected recipe.KEY=VALUE with KEY one of {known}")
            values[key] = value
        try:
            return type(self).model_validate(values)
        except ValidationError as err:
            p = first_problem(err)
            raise ConfigError(f"--set {', '.join(items)}: recipe.{p.field}: {p.message}") from None

    @classmethod
    def preset(cls, quick: bool) -> AgenticSettings:
        if quick:
            # a second pass (level 4) even so, so the quick recipe exercises both passes' code
            return cls(quick=True, eval_tasks=2, eval_samples=2, demo_tasks=4, ood=False, late_levels=[4])
        return cls()


def agentic_configs(run_dir: Path, settings: AgenticSettings, overrides: list[str]) -> tuple[Any, Any, Any]:
    """The imitation, late imitation and RL configs (presets ``agentic-imitation``, ``agentic-imitation-late``,
    ``agentic-rl``), each on the trained prompt (``settings.trained_shots``); ``overrides`` are
    ``imitation.KEY=VALUE``, ``late.KEY=VALUE`` or ``rl.KEY=VALUE`` (a bare ``KEY=VALUE`` goes to all three).
    Checked before any model loads."""
    from agentrft.store import RUN_STORE_NAME
    from agentrft.train.config import PRESETS, ConfigError, build_config
    from agentrft.train.config.presets import one_pass

    def trained_env(preset: str) -> str:
        return f"rollout.env={with_shots(PRESETS[preset]['rollout']['env'], settings.trained_shots)}"

    sft_sets = [f"data.source={run_dir / RUN_STORE_NAME}", trained_env("agentic-imitation")]
    late_sets = [*sft_sets[:1], trained_env("agentic-imitation-late")]
    rl_sets: list[str] = [trained_env("agentic-rl")]
    if settings.quick:
        sft_sets += ["steps=2", "sft.batch_size=4"]
        late_sets += ["steps=1", "sft.batch_size=4"]
        rl_sets += ["steps=2", "rollout.tasks_per_step=2", "rollout.group_size=4"]
    else:  # one pass over each pass's demonstrations (the late one's replayed ones included), as the presets take
        first, late_counts = settings.demo_counts()
        sft_sets.append(f"steps={one_pass(first)}")
        late_sets.append(f"steps={max(1, one_pass(late_counts))}")
    stages = {"imitation.": sft_sets, "late.": late_sets, "rl.": rl_sets}
    for item in overrides:
        key = item.partition("=")[0]
        prefix = next((p for p in stages if key.startswith(p)), None)
        if prefix is not None:
            stages[prefix].append(item.removeprefix(prefix))
        elif "=" in item:
            for sets in stages.values():
                sets.append(item)
        else:
            raise ConfigError(f"--set {item!r}: expected [imitation.|late.|rl.]KEY=VALUE, e.g. rl.steps=8")
    sft = build_config(PRESETS["agentic-imitation"], sft_sets, source="demo --agentic (imitation)")
    late = build_config(PRESETS["agentic-imitation-late"], late_sets, source="demo --agentic (late imitation)")
    rl = build_config(PRESETS["agentic-rl"], rl_sets, source="demo --agentic (rl)")
    if len({sft.policy.name, late.policy.name, rl.policy.name}) > 1:
        raise ConfigError("demo --agentic: imitation, late and rl must train the same policy.name")
    if "lora" in (sft.policy.finetune, late.policy.finetune, rl.policy.finetune):
        # the stages train the one in-process model in turn; a LoRA adapter would be wrapped again
        raise ConfigError("demo --agentic: policy.finetune: the recipe fine-tunes all weights (full), not lora")
    shots = {name: shots_of(cfg.rollout.env) for name, cfg in (("imitation", sft), ("late", late), ("rl", rl))}
    if len(set(shots.values())) > 1:
        # what is trained is what the later evals measure: one prompt for every stage
        raise ConfigError(
            "demo --agentic: imitation, late and rl must train on the same prompt; rollout.env shots differ: "
            + ", ".join(f"{name} {value or 'the environment default'}" for name, value in shots.items())
        )
    return sft, late, rl
