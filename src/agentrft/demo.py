"""`agentrft demo`: the whole loop on embedded defaults, on a laptop CPU.

held-out baseline eval -> GRPO training -> held-out eval again -> before/after table
and an HTML report, all in one run directory:

    RUN_DIR/agentrft.db      the store (eval runs "baseline" and "final", training rollouts, step metrics)
    RUN_DIR/metrics.jsonl    per-step training metrics
    RUN_DIR/config.yaml      the training config actually used
    RUN_DIR/demo.json        the before/after summary
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

    def summary(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "train_steps": self.train_steps,
            "seconds": self.seconds,
            "before": self.before.model_dump(mode="json", exclude={"per_task"}),
            "after": self.after.model_dump(mode="json", exclude={"per_task"}),
        }


def run_demo(
    run_dir: Path, settings: DemoSettings, overrides: list[str] | None = None, progress: bool = True
) -> DemoResult:
    """Baseline eval, GRPO training, final eval, report — on one in-process policy."""
    from agentrft.envs.registry import make_env
    from agentrft.eval.harness import evaluate
    from agentrft.eval.report import write_report
    from agentrft.graders import load_grader
    from agentrft.samplers.base import SamplingParams
    from agentrft.samplers.policies import load_trainable_policy
    from agentrft.store import RUN_STORE_NAME, Store
    from agentrft.train.config import PRESETS, build_config
    from agentrft.train.loop import Components, train

    preset = "demo-quick" if settings.quick else "demo"
    cfg = build_config(PRESETS[preset], overrides or [], source=f"demo (preset {preset})")
    run_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    env = make_env(cfg.rollout.env)
    grader = load_grader(cfg.rollout.grader or env.grader_spec())
    sampler = load_trainable_policy(cfg.policy.name, seed=cfg.seed, **cfg.policy.sampler_options())
    store = Store(run_dir / RUN_STORE_NAME)
    seconds["load"] = time.perf_counter() - t0
    params = SamplingParams(temperature=settings.eval_temperature, max_tokens=cfg.rollout.max_tokens)

    def held_out(name: str) -> Any:
        sampler.reseed(cfg.seed + 7919)  # both evals draw from the same sampler seed stream
        start = time.perf_counter()
        result = evaluate(
            env,
            sampler,
            split="held-out",
            samples=settings.eval_samples,
            tasks=settings.eval_tasks,
            store=store,
            run_name=name,
            params=params,
            env_spec=cfg.rollout.env,
            grader=grader,
            tool_format=cfg.rollout.tool_format,
            seed=cfg.seed,
            progress=progress,
        )
        seconds[f"eval_{name}"] = time.perf_counter() - start
        return result

    before = held_out("baseline")
    start = time.perf_counter()
    trained = train(cfg, run_dir, components=Components(env, sampler, grader, store), progress=progress)
    seconds["train"] = time.perf_counter() - start
    after = held_out("final")
    seconds["total"] = time.perf_counter() - t0
    result = DemoResult(run_dir=run_dir, before=before, after=after, train_steps=trained.steps, seconds=seconds)
    (run_dir / "demo.json").write_text(json.dumps(result.summary(), indent=2))
    write_report(run_dir)
    store.close()
    return result
