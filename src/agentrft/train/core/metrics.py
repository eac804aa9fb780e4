"""Per-step training metrics and where they go: JSONL in the run dir, the store, TensorBoard (W&B / MLflow if asked).

Names follow what RFT users expect (SPECS §1): ``train_reward_mean``,
``valid_reward_mean``, per-grader means ``train_reward/<grader>``, grader error
counts ``grader_errors/<flag>``, timing ``time/<stage>_s``, the process's peak resident
memory so far ``mem/peak_rss_mib``, tokens and tool calls per episode.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agentrft.eval.harness import EvalResult
from agentrft.step_metrics import read_step_metrics
from agentrft.train.config import LoggingConfig
from agentrft.types import Trajectory


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def rollout_metrics(trajs: list[Trajectory], prefix: str = "train") -> dict[str, float]:
    """Reward, success, grader errors, tokens and tool calls of a set of graded trajectories.

    Reward and success means are over the episodes whose grade measures them: an episode error or a
    grade with an error flag is counted (``_status/error``, ``_grader_errors``), never averaged in as 0.
    """
    graded = [t for t in trajs if t.grade is not None]
    measured = [t for t in graded if t.untrainable_reason() in (None, "no_tokens")]
    out: dict[str, float] = {
        f"{prefix}_episodes": float(len(trajs)),
        f"{prefix}_reward_mean": _mean([t.grade.reward for t in measured]),  # type: ignore[union-attr]
        f"{prefix}_success_rate": _mean([float(t.grade.success) for t in measured]),  # type: ignore[union-attr]
    }
    sub: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    for t in graded:
        assert t.grade is not None
        for name, value in t.grade.sub_rewards.items():
            if value is not None:
                sub.setdefault(name, []).append(float(value))
        for e in t.grade.errors:
            errors[e.flag] = errors.get(e.flag, 0) + 1
            errors[f"by_grader/{e.grader}"] = errors.get(f"by_grader/{e.grader}", 0) + 1
    for name, values in sorted(sub.items()):
        out[f"{prefix}_reward/{name}"] = _mean(values)
    out[f"{prefix}_grader_errors"] = float(sum(1 for t in graded if t.grade and t.grade.errors))
    for flag, n in sorted(errors.items()):
        out[f"{prefix}_grader_errors/{flag}"] = float(n)
    sampled = [t.tokens.num_sampled for t in trajs if t.tokens is not None]
    total = [len(t.tokens.ids) for t in trajs if t.tokens is not None]
    out[f"{prefix}_sampled_tokens"] = float(sum(sampled))
    out[f"{prefix}_sampled_tokens_per_episode"] = _mean([float(x) for x in sampled])
    out[f"{prefix}_tokens_per_episode"] = _mean([float(x) for x in total])
    out[f"{prefix}_tool_calls_per_episode"] = _mean([float(len(t.tool_calls)) for t in trajs])
    out[f"{prefix}_tool_errors_per_episode"] = _mean([float(sum(1 for c in t.tool_calls if c.error)) for t in trajs])
    out[f"{prefix}_turns_per_episode"] = _mean([float(t.num_turns) for t in trajs])
    out[f"{prefix}_distinct_answer_frac"] = _distinct_answer_frac(trajs)
    for status in ("completed", "max_turns", "truncated", "timeout", "error"):
        out[f"{prefix}_status/{status}"] = float(sum(1 for t in trajs if t.status == status))
    return out


def _distinct_answer_frac(trajs: list[Trajectory]) -> float:
    """The mean, over groups of two or more episodes, of the share of distinct final answers (whitespace and
    case aside; no answer counts as one answer): 1 when every episode answered otherwise, 1/G when all agreed."""
    groups: dict[str, list[str]] = {}
    for t in trajs:
        groups.setdefault(t.group_id, []).append(" ".join((t.final_answer or "").split()).lower())
    fracs = [len(set(answers)) / len(answers) for answers in groups.values() if len(answers) > 1]
    return _mean(fracs)


def eval_metrics(result: EvalResult, prefix: str = "valid") -> dict[str, float]:
    """Step metrics from an `eval.harness` result: reward (overall and per grader, ``valid_reward/<grader>``),
    success, pass@k / pass^k, grader errors (overall and per flag), tool use."""
    out = {
        f"{prefix}_episodes": float(result.n_trajectories),
        f"{prefix}_reward_mean": result.mean_reward,
        f"{prefix}_success_rate": result.success_rate,
        f"{prefix}_grader_errors": float(sum(result.grader_errors.values())),
        f"{prefix}_status/error": float(result.status_counts.get("error", 0)),
        f"{prefix}_tool_calls_per_episode": result.tools.calls_per_episode,
        f"{prefix}_tokens_per_episode": result.usage.tokens_per_episode,
    }
    out.update({f"{prefix}_pass@{k}": v for k, v in result.pass_at_k.items()})
    out.update({f"{prefix}_pass^{k}": v for k, v in result.pass_hat_k.items()})
    out.update({f"{prefix}_reward/{name}": v for name, v in result.sub_reward_mean.items()})
    flags: dict[str, int] = {}
    for key, n in result.grader_errors.items():  # keyed "grader:flag"
        flag = key.rsplit(":", 1)[-1]
        flags[flag] = flags.get(flag, 0) + n
    out.update({f"{prefix}_grader_errors/{flag}": float(n) for flag, n in sorted(flags.items())})
    return out


def is_timing_key(key: str) -> bool:
    """Keys that vary between identical runs (wall clock, process memory); resume-equality tests skip them."""
    return key.startswith(("time/", "mem/")) or key.endswith("tokens_per_s")


class MetricsLogger:
    """Writes each step's metrics to ``metrics.jsonl``, the store and the enabled trackers."""

    def __init__(
        self,
        run_dir: Path,
        cfg: LoggingConfig,
        *,
        store: Any = None,
        run_id: str = "",
        resume_from_step: int | None = None,
    ) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.store, self.run_id = store, run_id
        if resume_from_step is not None and self.path.exists():
            # Steps logged after the checkpoint we resume from will be redone: drop them (and a line
            # torn by the interruption), and write back what is kept.
            rows, _ = read_step_metrics(self.path)
            kept = [r for r in rows if r["step"] <= resume_from_step]
            self.path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        self._tb: Any = None
        self._wandb: Any = None
        self._mlflow: Any = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if cfg.wandb:
            try:
                import wandb
            except ImportError as exc:
                raise RuntimeError("logging.wandb is true but wandb is not installed (pip install wandb)") from exc
            self._wandb = wandb.init(project="agentrft", name=run_id, dir=str(run_dir), resume="allow")
        if cfg.mlflow:
            try:
                import mlflow
            except ImportError as exc:
                raise RuntimeError("logging.mlflow is true but mlflow is not installed (pip install mlflow)") from exc
            self._mlflow = mlflow
            mlflow.start_run(run_name=run_id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"step": step, **clean}, sort_keys=True) + "\n")
        if self.store is not None:
            self.store.log_metrics(self.run_id, step, clean)
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics({k.replace("/", "."): v for k, v in clean.items()}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The step metrics of ``run_dir`` (a torn last line, from an interruption, is left out)."""
    path = run_dir / "metrics.jsonl"
    return read_step_metrics(path)[0] if path.exists() else []
