"""`agentrft demo`: the whole loop on embedded defaults, on a laptop CPU.

held-out baseline eval -> GRPO training -> held-out eval again -> before/after table
and an HTML report, all in one run directory. With ``env`` (`agentrft demo --env SPEC`) the same loop learns
any environment from rewards alone (preset ``self-improve``: GRPO with the curriculum over the environment's
levels, from the base policy, no demonstrations); with ``expert_iteration`` a stage of rejection-sampling
fine-tuning on the policy's own successes (preset ``self-improve-ei``, its options as ``ei.KEY=V``) comes
before GRPO. The summary holds per-level pass rates and a paired test per level (same tasks, before vs after):

    RUN_DIR/agentrft.db      the store (eval runs "baseline" and "final", training rollouts, step metrics)
    RUN_DIR/metrics.jsonl    per-step training metrics
    RUN_DIR/config.yaml      the training config actually used
    RUN_DIR/demo.json        the before/after summary (per level and paired tests too)
    RUN_DIR/expert-iteration the rejection-sampling stage's run dir, where it ran
    RUN_DIR/report.html      the report (see agentrft.eval.report)

Both evals sample at the training temperature (0.7): pass@1 is the unbiased
estimate from ``eval_samples`` samples per task, so the figure measures the policy's
distribution, not one lucky greedy path.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class DemoSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    quick: bool = False
    eval_tasks: int = Field(default=32, ge=1, description="held-out tasks per eval")
    eval_samples: int = Field(default=2, ge=1, description="samples per task (pass@k for k <= this)")
    eval_temperature: float = Field(default=0.7, ge=0.0, description="the training temperature")

    @classmethod
    def preset(cls, quick: bool) -> DemoSettings:
        return cls(quick=True, eval_tasks=6, eval_samples=2) if quick else cls()


@dataclass
class DemoResult:
    run_dir: Path
    before: Any  # agentrft.eval.harness.EvalResult
    after: Any
    train_steps: int
    seconds: dict[str, float]

    def table_rows(self) -> list[tuple[str, str, str]]:
        k = max(self.before.pass_at_k)
        rows = [
            ("pass@1", f"{self.before.pass_at_k[1]:.3f}", f"{self.after.pass_at_k[1]:.3f}"),
            (f"pass@{k}", f"{self.before.pass_at_k[k]:.3f}", f"{self.after.pass_at_k[k]:.3f}"),
            (f"pass^{k}", f"{self.before.pass_hat_k[k]:.3f}", f"{self.after.pass_hat_k[k]:.3f}"),
            ("mean reward", f"{self.before.mean_reward:.3f}", f"{self.after.mean_reward:.3f}"),
            (
                "tool calls / episode",
                f"{self.before.tools.calls_per_episode:.2f}",
                f"{self.after.tools.calls_per_episode:.2f}",
            ),
            ("tool error rate", f"{self.before.tools.error_rate:.3f}", f"{self.after.tools.error_rate:.3f}"),
            (
                "tokens / episode",
                f"{self.before.usage.tokens_per_episode:.0f}",
                f"{self.after.usage.tokens_per_episode:.0f}",
            ),
            ("episodes", str(self.before.n_trajectories), str(self.after.n_trajectories)),
        ]
        return rows

    def per_level(self) -> dict[str, dict[str, Any]]:
        """Per level: pass@1 before and after, and the paired sign-flip test over the level's tasks."""
        from agentrft.eval.metrics import paired_test

        def key(task: Any) -> str:
            return "all" if task.level is None else str(task.level)

        out: dict[str, dict[str, Any]] = {}
        levels = sorted({key(t) for t in self.before.per_task}, key=lambda lv: (len(lv), lv))
        for level in levels:
            rates = [
                {t.task_id: t.success_rate for t in r.per_task if key(t) == level} for r in (self.before, self.after)
            ]
            test = paired_test(rates[0], rates[1])
            out[level] = {
                "n_tasks": test.n_tasks,
                "before": test.mean_a,
                "after": test.mean_b,
                "diff": test.diff,
                "p_value": test.p_value,
                "better": test.wins_b,
                "worse": test.wins_a,
            }
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "train_steps": self.train_steps,
            "seconds": self.seconds,
            "per_level": self.per_level(),
            "before": self.before.model_dump(mode="json", exclude={"per_task"}),
            "after": self.after.model_dump(mode="json", exclude={"per_task"}),
        }


def _has_levels(tasks: list[Any]) -> bool:
    return bool(tasks) and all(isinstance(t.data.get("level"), int) for t in tasks)


def demo_configs(
    settings: DemoSettings, overrides: list[str], env: str | None, expert_iteration: bool
) -> tuple[Any, Any]:
    """The GRPO stage's config (preset ``demo``, or ``self-improve`` for ``env``) and, with
    ``expert_iteration``, the rejection-sampling stage's (``self-improve-ei``, its options as ``ei.KEY=V``),
    playing the same episodes: the environment, its tool format, grader and policy settings."""
    from agentrft.train.config import PRESETS, ConfigError, build_config

    preset = ("demo-quick" if settings.quick else "demo") if env is None else "self-improve"
    quick = ["steps=2", "rollout.tasks_per_step=2", "rollout.group_size=4"] if settings.quick and env else []
    given = [f"rollout.env={env}"] if env else []
    ei_over = [o.removeprefix("ei.") for o in overrides if o.startswith("ei.")]
    grpo_over = [o for o in overrides if not o.startswith("ei.")]
    if ei_over and not expert_iteration:
        raise ConfigError("ei.KEY=V options set the expert-iteration stage; add --expert-iteration")
    cfg = build_config(PRESETS[preset], [*given, *quick, *grpo_over], source=f"demo (preset {preset})")
    if not expert_iteration:
        return cfg, None
    ei_quick = ["steps=2", "rejection_sampling.tasks_per_round=4", "rollout.group_size=4"] if settings.quick else []
    common = [o for o in grpo_over if o.split("=", 1)[0].split(".")[0] in ("policy", "seed")]
    common += [o for o in grpo_over if o.startswith(("rollout.grader=", "rollout.tool_format=", "rollout.max_tokens="))]
    shared = [f"rollout.env={cfg.rollout.env}", f"policy.name={cfg.policy.name}", f"seed={cfg.seed}", *common]
    ei_cfg = build_config(
        PRESETS["self-improve-ei"], [*shared, *ei_quick, *ei_over], source="demo (preset self-improve-ei)"
    )
    return cfg, ei_cfg


def _check_env(spec: str, environment: Any, cfg: Any) -> None:
    """An environment the demo learns from rewards alone: held-out tasks the training never sees; the
    curriculum off where its tasks carry no level."""
    from agentrft.envs.jsonl import JsonlEnv
    from agentrft.train.config import ConfigError

    if isinstance(environment, JsonlEnv) and environment._valid is None:
        raise ConfigError(f"{spec}: a jsonl environment's held-out split is its training file; add ?valid=FILE")
    if not environment.tasks("held-out"):
        raise ConfigError(f"{spec}: the environment has no held-out tasks to evaluate")
    if cfg.rollout.curriculum.enabled and not _has_levels(environment.tasks(cfg.rollout.split)):
        cfg.rollout.curriculum.enabled = False  # it draws by level; tasks with none: the seeded shuffle


def run_demo(
    run_dir: Path,
    settings: DemoSettings,
    overrides: list[str] | None = None,
    progress: bool = True,
    *,
    env: str | None = None,
    expert_iteration: bool = False,
) -> DemoResult:
    """Baseline eval, (expert iteration,) GRPO training, final eval, report — on one in-process policy.

    The evals grade with the environment's own grader; `rollout.grader` is the training's reward only."""
    from agentrft.envs.registry import make_env
    from agentrft.eval.harness import evaluate
    from agentrft.eval.report import write_report
    from agentrft.graders import load_grader
    from agentrft.samplers.base import SamplingParams
    from agentrft.samplers.policies import load_trainable_policy
    from agentrft.store import RUN_STORE_NAME, Store
    from agentrft.train.config.check import check_references
    from agentrft.train.loop import Components, train

    cfg, ei_cfg = demo_configs(settings, overrides or [], env, expert_iteration)
    run_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    environment = make_env(cfg.rollout.env)
    if env is not None:  # checked before the policy loads: the evals need held-out tasks the training never sees
        _check_env(env, environment, cfg)
    check_references(cfg, env=environment)  # what the config and --set options name, before the policy loads
    grader = load_grader(cfg.rollout.grader or environment.grader_spec())
    # the evals score what the environment scores: a training reward set with rollout.grader (shaped, partial
    # credit) is the training's choice, and its mean would not be the task's mean reward
    eval_grader = load_grader(environment.grader_spec()) if cfg.rollout.grader else grader
    sampler = load_trainable_policy(cfg.policy.name, seed=cfg.seed, **cfg.policy.sampler_options())
    store = Store(run_dir / RUN_STORE_NAME)
    seconds["load"] = time.perf_counter() - t0
    params = SamplingParams(temperature=settings.eval_temperature, max_tokens=cfg.rollout.max_tokens)

    def held_out(name: str) -> Any:
        start = time.perf_counter()
        result = evaluate(
            environment,
            sampler,
            split="held-out",
            samples=settings.eval_samples,
            tasks=settings.eval_tasks,
            store=store,
            run_name=name,
            params=params,
            env_spec=cfg.rollout.env,
            grader=eval_grader,
            tool_format=cfg.rollout.tool_format,
            seed=cfg.seed,
            sampling_seed=cfg.seed + 7919,  # both evals draw from the same sampler seed stream
            progress=progress,
        )
        seconds[f"eval_{name}"] = time.perf_counter() - start
        return result

    before = held_out("baseline")
    steps = 0
    if ei_cfg is not None:  # the policy's own successes, fine-tuned on in rounds; GRPO goes on from these weights
        start = time.perf_counter()
        ei_store = Store(run_dir / "expert-iteration" / RUN_STORE_NAME)
        stage = train(
            ei_cfg,
            run_dir / "expert-iteration",
            components=Components(environment, sampler, grader, ei_store),
            progress=progress,
        )
        ei_store.close()
        steps += stage.steps
        seconds["expert_iteration"] = time.perf_counter() - start
    start = time.perf_counter()
    trained = train(cfg, run_dir, components=Components(environment, sampler, grader, store), progress=progress)
    steps += trained.steps
    seconds["train"] = time.perf_counter() - start
    after = held_out("final")
    seconds["total"] = time.perf_counter() - t0
    result = DemoResult(run_dir=run_dir, before=before, after=after, train_steps=steps, seconds=seconds)
    (run_dir / "demo.json").write_text(json.dumps(result.summary(), indent=2))
    write_report(run_dir)
    store.close()
    return result
