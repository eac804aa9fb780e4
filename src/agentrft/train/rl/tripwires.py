"""Reward-hacking tripwires: signs, read from the run's own metrics as it trains, that the policy is learning the
grader rather than the task.

Three detectors, each checked after every step (`Tripwires.check`), each firing once until its condition
clears:

- ``check_falls``: the training reward rose while a held-out *check* grader (``tripwires.check_grader``: a gold
  grader other than the training one, e.g. the exact answer when training on a judge or a process reward),
  scored at every periodic eval on the eval set, fell beyond noise. The fall is measured from the best check so
  far; noise is twice the standard error of the difference of the two evals' means; the rise is the training
  reward's mean over the last ``window`` steps against its mean over the ``window`` steps up to that best eval,
  and must exceed ``min_rise``.
- ``diversity_collapse``: within groups the episodes stopped differing while they still fail: the mean share of
  distinct final answers per group (``train_distinct_answer_frac``) below ``min_distinct`` with the training
  success rate below 0.95, or the policy's token entropy below ``min_entropy``, for ``window`` steps in a row.
- ``length_drift`` / ``tool_call_drift``: sampled tokens (or tool calls) per episode moved the same way at each
  of the last ``drift_steps`` steps, by more than ``drift_ratio`` of where they started.

A firing is a logged warning, a ``tripwire/<kind>`` metric of 1 at that step (the report marks it on the
curves), a line in ``RUN_DIR/tripwires.jsonl``, and with ``action: stop`` the run stops after that step's
checkpoint.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from agentrft.train.config.method import _Cfg

log = logging.getLogger("agentrft.train")


class TripwiresConfig(_Cfg):
    enabled: bool = Field(
        default=False, description="watch the run for signs of reward hacking (train/rl/tripwires.py)"
    )
    check_grader: dict[str, Any] | None = Field(
        default=None,
        description="a gold grader, other than the training one, scored on the eval set at every periodic eval "
        "(needs eval.every_steps); without it the check_falls tripwire is off",
    )
    action: Literal["warn", "stop"] = Field(default="warn", description="stop: end the run after the step's checkpoint")
    window: int = Field(default=3, ge=1, description="steps (or their train-reward means) each comparison spans")
    min_rise: float = Field(default=0.1, ge=0.0, description="training-reward rise that check_falls needs")
    min_distinct: float = Field(default=0.2, ge=0.0, le=1.0, description="diversity: distinct answers per group")
    min_entropy: float = Field(default=0.02, ge=0.0, description="diversity: the policy's mean token entropy")
    drift_steps: int = Field(default=5, ge=2, description="steps of drift in one direction")
    drift_ratio: float = Field(default=0.5, gt=0.0, description="relative change over drift_steps that fires")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


class Tripwires:
    """The detectors over a run's metric history (module docstring); `check` is called once per step."""

    def __init__(self, cfg: TripwiresConfig, run_dir: Path | None = None) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        self.history: list[dict[str, float]] = []
        self.active: set[str] = set()  # conditions true at the last step (a kind fires again only after clearing)
        self.stop = False

    def check(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """The tripwire metrics of this step (``tripwire/<kind>`` = 1 for each that fires now)."""
        self.history.append({"step": float(step), **metrics})
        conditions = {
            "check_falls": self._check_falls(),
            "diversity_collapse": self._diversity_collapse(),
            "length_drift": self._drift("train_sampled_tokens_per_episode"),
            "tool_call_drift": self._drift("train_tool_calls_per_episode"),
        }
        out: dict[str, float] = {}
        for kind, detail in conditions.items():
            if detail is None:
                self.active.discard(kind)
                continue
            if kind in self.active:
                continue
            self.active.add(kind)
            out[f"tripwire/{kind}"] = 1.0
            log.warning("tripwire %s at step %d: %s", kind, step, detail)
            if self.run_dir is not None:
                with (self.run_dir / "tripwires.jsonl").open("a") as f:
                    f.write(json.dumps({"step": step, "kind": kind, "detail": detail}) + "\n")
            self.stop = self.stop or self.cfg.action == "stop"
        return out

    def _series(self, key: str) -> list[float]:
        return [h[key] for h in self.history if key in h and not math.isnan(h[key])]

    def _check_falls(self) -> str | None:
        evals = [h for h in self.history if "valid_check_reward" in h]
        if len(evals) < 2 or evals[-1] is not self.history[-1]:
            return None
        best = max(evals[:-1], key=lambda h: h["valid_check_reward"])
        now = evals[-1]
        fall = best["valid_check_reward"] - now["valid_check_reward"]
        noise = 2 * math.hypot(best.get("valid_check_se", 0.0), now.get("valid_check_se", 0.0))
        w = self.cfg.window
        rewards = [(h["step"], h["train_reward_mean"]) for h in self.history if "train_reward_mean" in h]
        before = _mean([r for s, r in rewards if s <= best["step"]][-w:])
        after = _mean([r for s, r in rewards][-w:])
        rise = after - before
        if fall > noise and fall > 0 and rise > self.cfg.min_rise:
            return (
                f"training reward rose {before:.3f} -> {after:.3f} while the check fell "
                f"{best['valid_check_reward']:.3f} (step {int(best['step'])}) -> {now['valid_check_reward']:.3f} "
                f"(noise {noise:.3f})"
            )
        return None

    def _diversity_collapse(self) -> str | None:
        w = self.cfg.window
        recent = self.history[-w:]
        if len(recent) < w:
            return None
        distinct = [h.get("train_distinct_answer_frac") for h in recent]
        success = [h.get("train_success_rate", 0.0) for h in recent]
        if all(d is not None and d < self.cfg.min_distinct for d in distinct) and max(success) < 0.95:
            return f"distinct answers per group {distinct[-1]:.2f} < {self.cfg.min_distinct:g} for {w} steps"
        entropy = [h.get("entropy") for h in recent]
        if all(e is not None and e < self.cfg.min_entropy for e in entropy):
            return f"token entropy {entropy[-1]:.4f} < {self.cfg.min_entropy:g} for {w} steps"
        return None

    def _drift(self, key: str) -> str | None:
        n = self.cfg.drift_steps
        values = self._series(key)[-n:]
        if len(values) < n or values[0] <= 0:
            return None
        steps = [b - a for a, b in itertools.pairwise(values)]
        one_way = all(d > 0 for d in steps) or all(d < 0 for d in steps)
        change = (values[-1] - values[0]) / values[0]
        if one_way and abs(change) > self.cfg.drift_ratio:
            return f"{key} moved one way for {n} steps: {values[0]:.1f} -> {values[-1]:.1f} ({change:+.0%})"
        return None
