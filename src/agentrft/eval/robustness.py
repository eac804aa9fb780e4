"""Robustness to tool faults: the same eval, clean and under each fault schedule (`envs.faults`).

`evaluate_robustness` plays the clean eval, then one eval per fault spec, each with the same sampling seed
and tasks (so the episodes differ only where a fault made them), and reports for each: pass@1, the episodes a
fault hit, and the recovery rate (of those, how many still succeeded).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from agentrft.envs.faults import FaultSpec, with_faults
from agentrft.eval.harness import EvalResult, evaluate


class RobustnessRow(BaseModel):
    faults: str  # the spec, "none" for the clean eval
    run_id: str | None
    pass_at_1: float
    episodes: int
    hit: int  # episodes at least one injected fault reached
    recovered: int  # of those, the successes
    faults_injected: int

    @property
    def recovery_rate(self) -> float | None:
        return self.recovered / self.hit if self.hit else None


def robustness_row(spec: str, result: EvalResult, store: Any) -> RobustnessRow:
    """One row from an eval run's stored episodes."""
    trajs = store.query_trajectories(run_id=result.run_id)
    faults = [len((t.metadata.get("env") or {}).get("faults", [])) for t in trajs]
    success = [bool(t.grade and t.grade.success) for t in trajs]
    return RobustnessRow(
        faults=spec,
        run_id=result.run_id,
        pass_at_1=result.pass_at_k.get(1, result.success_rate),
        episodes=len(trajs),
        hit=sum(n > 0 for n in faults),
        recovered=sum(n > 0 and ok for n, ok in zip(faults, success, strict=True)),
        faults_injected=sum(faults),
    )


def evaluate_robustness(
    env: Any, sampler: Any, *, specs: Sequence[FaultSpec], store: Any, run_name: str = "eval", **kwargs: Any
) -> tuple[EvalResult, list[RobustnessRow]]:
    """The clean eval's result, and a row for it and for each fault spec (`FaultSpec.parse` reads one)."""
    clean = evaluate(env, sampler, store=store, run_name=run_name, **kwargs)
    rows = [robustness_row("none", clean, store)]
    for spec in specs:
        result = evaluate(
            with_faults(env, spec), sampler, store=store, run_name=f"{run_name} faults={spec.text()}", **kwargs
        )
        rows.append(robustness_row(spec.text(), result, store))
    return clean, rows
